"""Success rule: when is a DDPJob done?

torchrun's agent exits 0 only after its whole worker group finished its rendezvous round successfully,
so one worker pod that exits 0 proves the training completed. The rule, for fixed and elastic jobs alike:

* the job **Succeeded** when at least one worker exited 0 and every other worker has terminated too
  (Succeeded or Failed), or when ``rendezvous.closeTimeoutSeconds`` have passed since the first success
  (a straggler still waiting to join a closed rendezvous is then cleaned up by ``cleanPodPolicy``);
* after the first success the operator replaces no failed worker: a replacement would only wait for a
  rendezvous that will never open again.

With a fixed-size job every worker exits 0 together, so this is "all workers succeeded". With an elastic
job, a worker that was still joining (or being replaced) when the others finished cannot hold the job
hostage, which is why we do not require all ``replicas`` pods to succeed.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from ddpjob_operator.planner.observation import PodView


def first_success(workers: Sequence[PodView]) -> datetime | None:
    """When the first worker exited 0 (finish time if known), or None."""
    times = [p.finished_at or p.created_at for p in workers if p.phase == "Succeeded"]
    return min((t for t in times if t is not None), default=None) if times else None


def job_succeeded(workers: Sequence[PodView], close_timeout_seconds: int, now: datetime) -> bool:
    """Apply the success rule to the observed worker pods."""
    first = first_success(workers)
    if first is None:
        return False
    if all(p.terminated for p in workers):
        return True
    return now - first >= timedelta(seconds=close_timeout_seconds)


def any_succeeded(workers: Sequence[PodView]) -> bool:
    """True once a worker exited 0 (the job stops replacing failed workers)."""
    return any(p.phase == "Succeeded" for p in workers)

"""Pods lost while no operator watched: missing on a (re)started operator's first pass over a running job, with no
Terminating state or tombstone to count (a pod deleted, or its node removed, during a leader takeover).

Each such loss is counted once, whatever happens around that pass:

- its UID is synthetic and stable (the job's UID and the pod's index, or ``rdzv``), so a first pass repeated after
  its status write was refused, or after the operator restarted, finds the same loss;
- the UID stays in ``status.countedFailures`` while its pod is still missing (:func:`still_missing`), so a first
  pass that comes after the count was written, but before the pod exists again (another takeover), counts nothing
  new; once the pod exists again the UID leaves the list, and the next such loss of it counts anew;
- the pod is created again by the pass after the one that counts it (:func:`hold`), as every loss is acted on once
  its count is written. A first pass that created the rendezvous pod and then could not write its status left the
  next pass nothing missing to count: the incident was lost (the e2e soak, 2026-12-07: a rendezvous pod deleted
  right after kill -9 of the leading operator was recreated by the new leader, and never counted).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from ddpjob_operator.api import names
from ddpjob_operator.api.reasons import POD_DELETED, RENDEZVOUS_LOST
from ddpjob_operator.api.spec import DDPJob
from ddpjob_operator.planner.observation import PodView
from ddpjob_operator.planner.policies.failure import Loss

PREFIX = "vanished-"
_RDZV = "rdzv"


def _head(job_uid: str) -> str:
    return f"{PREFIX}{job_uid}-"


def loss_uid(job_uid: str, index: int | None) -> str:
    """The stable UID of the loss of worker ``index`` (None: the rendezvous pod) of the job with ``job_uid``."""
    return _head(job_uid) + (_RDZV if index is None else str(index))


def _pod_name(uid: str, job: DDPJob) -> str | None:
    """The name of the pod whose loss ``uid`` is, if it is such a UID of this job."""
    head = _head(job.uid)
    if not uid.startswith(head):
        return None
    which = uid[len(head):]
    if which == _RDZV:
        return names.rendezvous_pod_name(job.name)
    return names.worker_pod_name(job.name, int(which)) if which.isdigit() else None


def still_missing(uid: str, job: DDPJob, pods: Iterable[PodView]) -> bool:
    """Whether ``uid`` is a loss of this job found on a first pass whose pod is still not there again."""
    name = _pod_name(uid, job)
    return name is not None and not any(p.name == name and not p.gone for p in pods)


def losses(job: DDPJob, workers: Sequence[PodView], rendezvous: Sequence[PodView], had: int, now: datetime
           ) -> list[Loss]:
    """The pods of a running job that are not there at all. ``had`` is status.replicas as last written (spares not
    counted): indices above it plus the spares were never running (a scale-up), so only those below count."""
    seen = {p.index for p in workers if p.index is not None}
    out = [Loss(names.worker_pod_name(job.name, i), loss_uid(job.uid, i), i, POD_DELETED, now,
                "gone while no operator was watching (deleted, or its node removed)", unwatched=True)
           for i in range(min(job.spec.pod_count, had + job.spec.spares)) if i not in seen]
    if not rendezvous:
        out.append(Loss(names.rendezvous_pod_name(job.name), loss_uid(job.uid, None), None, RENDEZVOUS_LOST, now,
                        "rendezvous pod gone while no operator was watching", unwatched=True))
    return out


def hold(create: list[dict[str, Any]], counted_now: Iterable[Loss]) -> list[dict[str, Any]]:
    """The pods to create, less those whose loss this pass counts as unwatched: the next pass creates them."""
    held = {loss.pod for loss in counted_now if loss.unwatched}
    return [p for p in create if p["metadata"]["name"] not in held]

"""A held job runs no pods: suspended (spec.runPolicy.suspend), or queued in Kueue (not admitted yet, evicted, its
Workload gone). Each pod is deleted gracefully, so its workers write their SIGTERM checkpoint; one stuck Terminating
on a NotReady node past spec.runPolicy.terminatingNodeTimeoutSeconds is force-deleted, as a running job's is
(stuck.py): its kubelet will never confirm the deletion, and while it stays an evicted job's Kueue quota is never
given back (kueue/gate.py counts a Terminating pod as active) and a resumed job cannot reuse its name."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from ddpjob_operator.planner.observation import PodView
from ddpjob_operator.planner.policies import stuck
from ddpjob_operator.planner.policies.pods import DeletePod, PodPlan


def plan_pods(pods: Sequence[PodView], reason: str, *, node_ready: Mapping[str, bool], timeout_seconds: int,
              now: datetime) -> PodPlan:
    """The deletes of a held job's pods (``pods``: the job's own, gone ones left out), and when to look again at
    one Terminating that may become stuck."""
    plan = PodPlan()
    for pod in pods:
        if pod.gone:
            continue
        if not pod.deleting:
            plan.delete.append(DeletePod(pod.name, pod.uid, pod.terminated, reason))
        elif stuck.is_stuck_terminating(pod, node_ready, timeout_seconds, now):
            plan.delete.append(DeletePod(pod.name, pod.uid, True, "NodeNotReady"))
        elif (at := stuck.stuck_check_at(pod, timeout_seconds)) is not None:
            plan.recheck.append(at)
    return plan

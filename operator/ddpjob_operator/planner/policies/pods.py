"""Pods: which of the job's pods to delete and which to create this pass, once losses are counted.

Pods are the job's by controller ownerReference UID, never by label alone. A lost pod is acted on only after
its loss is counted (its UID is in ``counted``, persisted by an earlier pass): a failed one is force-deleted
(its containers already ended) and recreated at the same index in the same pass; one restarted by an incident
decision (a stall) is deleted gracefully, so it gets its SIGTERM checkpoint; one being deleted by someone else
is awaited, because its name is still taken. Names are deterministic, so a repeated create is a harmless 409.
One its group reported silent is force-deleted only where its node is NotReady: on a node Kubernetes calls Ready
the report may be wrong (a slow network, a paused agent), and a force delete would SIGKILL a healthy pod with no
SIGTERM checkpoint; it is deleted gracefully first, and forced only if that did not finish in time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from ddpjob_operator.api.spec import DDPJob
from ddpjob_operator.planner.children import builders
from ddpjob_operator.planner.observation import PodView
from ddpjob_operator.planner.policies import silent as silent_reports
from ddpjob_operator.planner.policies import stuck

Obj = dict[str, Any]

#: How long after its grace period ended a pod its group reported silent may stay Terminating on a node Kubernetes
#: still calls Ready before it is force-deleted: a live kubelet removes it within seconds of that end (SIGKILL), so
#: one still there is on a node that no longer answers (powered off, cut off), which Kubernetes has not noticed yet.
SILENT_FORCE_AFTER_SECONDS = 15


@dataclasses.dataclass(frozen=True, slots=True)
class DeletePod:
    """Delete one pod; ``force`` sets gracePeriodSeconds=0 (stuck pods, or pods already terminated)."""

    name: str
    uid: str
    force: bool
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class Replacement:
    """A lost worker replaced in this pass (for the failure->replacement metric and the Event)."""

    index: int
    exit_code: int | None
    failed_at: datetime | None


@dataclasses.dataclass(kw_only=True)
class PodPlan:
    """Pod actions of one pass."""

    delete: list[DeletePod] = dataclasses.field(default_factory=list)
    create: list[Obj] = dataclasses.field(default_factory=list)
    replacements: list[Replacement] = dataclasses.field(default_factory=list)
    conflicts: list[str] = dataclasses.field(default_factory=list)
    recheck: list[datetime] = dataclasses.field(default_factory=list)
    """When to look again (a Terminating pod may become stuck)."""


def reported_silent(workers: Sequence[PodView], reported: Mapping[str, silent_reports.Report]) -> set[str]:
    """UIDs of the workers their group reported silent (policies/silent.py): live ones, and those being deleted for
    it (gracefully first where the node is Ready), whose report is still about them."""
    return {p.uid for p in workers
            if silent_reports.applies(dataclasses.replace(p, deletion_timestamp=None) if p.deleting else p,
                                      reported.get(p.name))}


def silent_nodes(pods_: Sequence[PodView], status: Mapping[str, Any]) -> set[str]:
    """The nodes of counted pods their group reported silent: whether each is NotReady decides a forced or a
    graceful delete (_silent), so the controller reads them for the pass."""
    counted = status.get("countedFailures")
    uids = {u for u in counted if isinstance(u, str)} if isinstance(counted, list) else set()
    quiet = reported_silent([p for p in pods_ if p.uid in uids], silent_reports.reports(status.get("progress")))
    return {p.node_name for p in pods_ if p.uid in quiet and p.node_name}


def _stuck(pod: PodView, node_ready: Mapping[str, bool], timeout: int, now: datetime, plan: PodPlan) -> bool:
    if stuck.is_stuck_terminating(pod, node_ready, timeout, now):
        plan.delete.append(DeletePod(pod.name, pod.uid, True, "NodeNotReady"))
        return True
    at = stuck.stuck_check_at(pod, timeout)
    if at is not None:
        plan.recheck.append(at)
    return False


def _silent(pod: PodView, node_ready: Mapping[str, bool], now: datetime, plan: PodPlan, avoid: dict[int, str]
            ) -> bool:
    """A counted pod its group reported silent: force-deleted at once where its node is NotReady (or it has none),
    else deleted gracefully, and forced once its grace period and SILENT_FORCE_AFTER_SECONDS passed with the pod
    still there. True when it is force-deleted now: its index is created again in the same pass, away from its
    node (its name is free as soon as the API server answers)."""
    assert pod.index is not None
    node_lost = not pod.node_name or node_ready.get(pod.node_name) is False
    if pod.deletion_timestamp is not None:
        due = pod.deletion_timestamp + timedelta(seconds=SILENT_FORCE_AFTER_SECONDS)
        if not node_lost and now < due:
            plan.recheck.append(due)
            return False
    elif not node_lost:
        plan.delete.append(DeletePod(pod.name, pod.uid, False, "Silent"))
        return False
    plan.delete.append(DeletePod(pod.name, pod.uid, True, "Silent"))
    plan.replacements.append(Replacement(pod.index, None, now))
    if pod.node_name:
        avoid[pod.index] = pod.node_name
    return True


def plan_workers(
    job: DDPJob,
    workers: Sequence[PodView],
    foreign: Sequence[PodView],
    counted: Collection[str],
    *,
    node_ready: Mapping[str, bool],
    generation: int,
    incidents: int,
    create: bool,
    now: datetime,
    silent: Collection[str] = (),
) -> PodPlan:
    """Deletes and creates for the worker pods. ``create`` is False while children conflict or after success.
    ``silent``: UIDs of pods their group reported silent (policies/silent.py), live or being deleted for it:
    replaced once counted, at once where their node is NotReady (_silent)."""
    spec = job.spec
    timeout = spec.run_policy.terminating_node_timeout_seconds
    plan = PodPlan()
    taken: set[int] = set()
    avoid: dict[int, str] = {}
    for pod in sorted(workers, key=lambda p: (p.index if p.index is not None else -1, p.name)):
        if pod.gone or pod.index is None:
            continue
        if pod.uid in counted and pod.uid in silent and pod.index < spec.pod_count:
            if not _silent(pod, node_ready, now, plan, avoid):
                taken.add(pod.index)  # the name is taken until the pod is gone
        elif pod.deleting:
            if not _stuck(pod, node_ready, timeout, now, plan):
                taken.add(pod.index)  # the name is taken until the pod is gone
        elif pod.index >= spec.pod_count:
            plan.delete.append(DeletePod(pod.name, pod.uid, pod.terminated, "ScaledDown"))
            taken.add(pod.index)
        elif pod.uid in counted and pod.phase == "Failed":
            plan.delete.append(DeletePod(pod.name, pod.uid, True, "Replaced"))
            plan.replacements.append(Replacement(pod.index, pod.exit_code, pod.finished_at))
        elif pod.uid in counted and pod.phase != "Succeeded":
            plan.delete.append(DeletePod(pod.name, pod.uid, False, "Restarted"))
            taken.add(pod.index)
        else:
            taken.add(pod.index)
    blocked = {p.index for p in foreign if p.index is not None and not p.gone}
    for pod in foreign:
        if pod.index is not None and pod.index < spec.pod_count and not pod.deleting and not pod.gone:
            plan.conflicts.append(f"Pod {pod.name} exists and is not controlled by this DDPJob (controller uid "
                                  f"{pod.owner_uid or 'none'}); delete it: the operator never adopts pods")
    if not create or plan.conflicts:
        return plan
    for i in range(spec.pod_count):  # hot spares are worker pods too: the rendezvous decides who trains
        if i not in taken and i not in blocked:
            made = builders.build_worker_pod(job, i, generation=generation, incidents=incidents)
            plan.create.append(builders.avoiding_node(made, avoid[i]) if i in avoid else made)
    return plan


def plan_rendezvous(
    job: DDPJob,
    pods: Sequence[PodView],
    foreign: Sequence[PodView],
    counted: Collection[str],
    *,
    node_ready: Mapping[str, bool],
    create: bool,
    now: datetime,
) -> PodPlan:
    """Keep exactly one live rendezvous pod: replace it once its loss is counted, wait while its name is taken."""
    timeout = job.spec.run_policy.terminating_node_timeout_seconds
    plan = PodPlan()
    name_taken = any(not p.gone for p in foreign)
    healthy = False
    for pod in pods:
        if pod.gone:
            continue
        if pod.deleting:
            name_taken = name_taken or not _stuck(pod, node_ready, timeout, now, plan)
        elif pod.terminated:
            if pod.uid in counted:
                plan.delete.append(DeletePod(pod.name, pod.uid, True, "RendezvousEnded"))
            else:
                name_taken = True  # counted first (this pass), replaced in the next
        else:
            healthy = True
    if not healthy and not name_taken and create:
        plan.create.append(builders.build_rendezvous_pod(job))
    return plan


def merge(*plans: PodPlan) -> PodPlan:
    """One plan of several; the rendezvous pod's create goes first (workers need the store)."""
    out = PodPlan()
    for p in plans:
        out.delete += p.delete
        out.create += p.create
        out.replacements += p.replacements
        out.conflicts += p.conflicts
        out.recheck += p.recheck
    out.create.sort(key=lambda o: 0 if o["metadata"]["name"].endswith("-rdzv") else 1)
    return out

"""Pods: which of the job's pods to delete and which to create this pass, once losses are counted.

Pods are the job's by controller ownerReference UID, never by label alone. A lost pod is acted on only after
its loss is counted (its UID is in ``counted``, persisted by an earlier pass): a failed one is force-deleted
(its containers already ended) and recreated at the same index in the same pass; one restarted by an incident
decision (a stall) is deleted gracefully, so it gets its SIGTERM checkpoint; one being deleted by someone else
is awaited, because its name is still taken. Names are deterministic, so a repeated create is a harmless 409.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from ddpjob_operator.api.spec import DDPJob
from ddpjob_operator.planner.children import builders
from ddpjob_operator.planner.observation import PodView
from ddpjob_operator.planner.policies import stuck

Obj = dict[str, Any]


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


def _stuck(pod: PodView, node_ready: Mapping[str, bool], timeout: int, now: datetime, plan: PodPlan) -> bool:
    if stuck.is_stuck_terminating(pod, node_ready, timeout, now):
        plan.delete.append(DeletePod(pod.name, pod.uid, True, "NodeNotReady"))
        return True
    at = stuck.stuck_check_at(pod, timeout)
    if at is not None:
        plan.recheck.append(at)
    return False


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
    ``silent``: UIDs of pods their group reported silent (policies/silent.py): replaced at once, once counted."""
    spec = job.spec
    timeout = spec.run_policy.terminating_node_timeout_seconds
    plan = PodPlan()
    taken: set[int] = set()
    avoid: dict[int, str] = {}
    for pod in sorted(workers, key=lambda p: (p.index if p.index is not None else -1, p.name)):
        if pod.gone or pod.index is None:
            continue
        if pod.deleting:
            if not _stuck(pod, node_ready, timeout, now, plan):
                taken.add(pod.index)  # the name is taken until the pod is gone
            continue
        if pod.index >= spec.pod_count:
            plan.delete.append(DeletePod(pod.name, pod.uid, pod.terminated, "ScaledDown"))
            taken.add(pod.index)
        elif pod.uid in counted and pod.uid in silent:
            # Its node may be cut off, not down: nothing would ever confirm a graceful delete. Force, and create
            # it again at once (its name is free as soon as the API server answers).
            plan.delete.append(DeletePod(pod.name, pod.uid, True, "Silent"))
            plan.replacements.append(Replacement(pod.index, None, now))
            if pod.node_name:
                avoid[pod.index] = pod.node_name
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

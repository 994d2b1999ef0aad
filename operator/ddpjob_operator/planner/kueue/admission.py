"""The planner's side of Kueue for one pass of a queued job: its Workload among the children, the gate, the
admitted placement and count, the conditions that say where the job stands, and the Workload writes the pass
asks for (planner/kueue/workload.py builds and reads the objects; kueue/gate.py decides)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from ddpjob_operator.api import names, reasons
from ddpjob_operator.api.formats import parse_time, truncate
from ddpjob_operator.api.spec import DDPJob
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.children import builders
from ddpjob_operator.planner.kueue import gate as gating
from ddpjob_operator.planner.kueue import workload as kueue
from ddpjob_operator.planner.kueue.workload import Placement, WorkloadView
from ddpjob_operator.planner.observation import ChildView, PodView

Obj = dict[str, Any]
#: The Admitted condition of a queued job: its type is also its reason (api/reasons.py).
ADMITTED = reasons.ADMITTED

# The Workload's conditions are Kueue's API: the operator writes them in Kueue's own words, as Kueue's jobframework
# does (api/reasons.py names them): its Finished reason is the job's end (Succeeded or Failed), its Requeued reason
# the eviction's.


@dataclasses.dataclass(frozen=True, slots=True)
class WorkloadWrite:
    """A write to the job's Workload: give the quota back, mark it Finished, own it, (de)activate it."""

    name: str
    op: str
    """"clear", "podsready", "finish" (its status); "adopt" (a prebuilt Workload gets the job as its controller
    owner); "deactivate", "activate" (spec.active for a suspend and a resume: kueue/suspension.py)."""
    reason: str
    message: str
    succeeded: bool = False
    """Finished: Succeeded or Failed; PodsReady: True or False."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class KueueInputs:
    """What the controller read for a queued job before the pass (the planner reads no API)."""

    priority: tuple[str, int] | None = None
    """The job's WorkloadPriorityClass (name, value), if it names one that exists."""
    priority_missing: str | None = None
    """Why the priority class cannot be used (it does not exist), if it cannot."""
    flavors: Mapping[str, Obj] = dataclasses.field(default_factory=dict)
    """The admitted ResourceFlavors' specs, by name."""


def workload_view(job: DDPJob, children: Mapping[tuple[str, str], ChildView]) -> WorkloadView | None:
    """The job's own Workload as last seen, or None if it has none (or it is on its way out). A prebuilt one is the
    job's before the job owns it too (adopt)."""
    child = children.get((kueue.WORKLOAD, kueue.workload_name(job)))
    unowned_prebuilt = kueue.prebuilt(job) is not None and child is not None and child.owner_uid is None
    if child is None or (child.owner_uid != job.uid and not unowned_prebuilt) or child.deleting:
        return None
    return child.workload


def adopt(job: DDPJob, children: Mapping[tuple[str, str], ChildView]) -> list[WorkloadWrite]:
    """The prebuilt Workload gets the job as its controller owner, as jobframework does: it then goes with the job."""
    name = kueue.prebuilt(job)
    child = children.get((kueue.WORKLOAD, name)) if name is not None else None
    if name is None or child is None or child.owner_uid is not None or child.deleting:
        return []
    return [WorkloadWrite(name, "adopt", "Prebuilt", f"the Workload Kueue made for DDPJob {job.name} is now its own")]


def desired(job: DDPJob, inputs: KueueInputs) -> list[Obj]:
    """The Workload among the job's children (none while its priority class is missing: a Workload without the
    priority would be admitted at the wrong priority; none for a job whose Workload Kueue made: it is adopted)."""
    if kueue.queue_name(job) is None or inputs.priority_missing is not None or kueue.prebuilt(job) is not None:
        return []
    return [kueue.build_workload(job, builders.build_worker_pod(job, 0), builders.build_rendezvous_pod(job),
                                 inputs.priority)]


def pods_active(job: DDPJob, pods: Sequence[PodView]) -> bool:
    """Whether a pod of the job still runs or terminates: an evicted Workload keeps its quota until none does."""
    return any(p.active or (not p.gone and p.deleting) for p in pods if p.owner_uid == job.uid)


def gate(job: DDPJob, view: WorkloadView | None, pods: Sequence[PodView], inputs: KueueInputs) -> gating.Gate:
    """May the job run its pods this pass (kueue/gate.py)."""
    return gating.decide(kueue.workload_name(job), kueue.queue_name(job) or "", view,
                         pods_active=pods_active(job, pods), priority_missing=inputs.priority_missing)


def placements(job: DDPJob, view: WorkloadView, inputs: KueueInputs) -> dict[str, Placement]:
    """Each replica type's placement under the admission."""
    return {names.TYPE_WORKER: kueue.placement(view, kueue.WORKERS, inputs.flavors, job.spec.pod_count),
            names.TYPE_RENDEZVOUS: kueue.placement(view, kueue.RENDEZVOUS, inputs.flavors, 1)}


def capped(job: DDPJob, workers: int) -> DDPJob:
    """The job as admitted: an elastic job admitted with fewer workers than it asked for runs that many (Kueue's
    partial admission; spares go first)."""
    if workers >= job.spec.pod_count:
        return job
    spec = job.spec.model_copy(update={"replicas": min(job.spec.replicas, workers),
                                       "spares": max(0, workers - job.spec.replicas)})
    return job.model_copy(update={"spec": spec})


def place(pods: Sequence[Obj], where: Mapping[str, Placement]) -> list[Obj]:
    """Pods to create, with their pod set's flavor node labels and tolerations."""
    return [kueue.place_pod(p, where[p["metadata"]["labels"][names.LABEL_REPLICA_TYPE]]) for p in pods]


def conditions(g: gating.Gate, view: WorkloadView | None) -> list[st.Aux]:
    """Queued (Kueue's reason and message) and Admitted (the ClusterQueue and flavors) of a queued job."""
    if g.run and view is not None:
        return [st.Aux(st.QUEUED, False, ADMITTED, "admitted by Kueue"),
                st.Aux(ADMITTED, True, ADMITTED, truncate(f"admitted by Kueue: {kueue.describe(view)}"))]
    return [st.Aux(st.QUEUED, True, g.reason, truncate(g.message)),
            st.Aux(ADMITTED, False, g.reason, "not admitted by Kueue", show=True)]


def pods_ready(job: DDPJob, view: WorkloadView | None, state: str) -> list[WorkloadWrite]:
    """The Workload's PodsReady condition (Kueue's waitForPodsReady): False (WaitForStart) from the admission until
    every pod runs, then True, and it stays True through a recovery. The operator replaces lost pods itself within
    the job's own budget (backoffLimit, the stall deadlines), so a recovery is not a reason for Kueue to evict the
    job after its recoveryTimeout: only a start that never completes is (docs/scheduling.md, "Kueue")."""
    if kueue.queue_name(job) is None or view is None or not view.admitted:
        return []
    old = view.conditions.get("PodsReady")
    ready = state == st.RUNNING or (old is not None and old.status)
    if old is not None and old.status == ready:
        return []
    reason = reasons.STARTED if ready else reasons.WAIT_FOR_START
    return [WorkloadWrite(kueue.workload_name(job), "podsready", reason, "", ready)]


def finish(job: DDPJob, view: WorkloadView | None, succeeded: bool, message: str) -> list[WorkloadWrite]:
    """Mark the Workload Finished when the job ends (Kueue releases its quota)."""
    if kueue.queue_name(job) is None or view is None or view.true("Finished"):
        return []
    return [WorkloadWrite(kueue.workload_name(job), "finish", st.SUCCEEDED if succeeded else st.FAILED, message,
                          succeeded)]


_EVICTED = re.compile(r"^evicted by Kueue \((\w+)\)")


def transitions(old: Mapping[str, Any], new: Mapping[str, Any], now: datetime) -> tuple[float | None, str | None]:
    """For the metrics, from a status write: (seconds the job waited Queued, if an admission ended the wait now;
    Kueue's eviction reason, if the job was evicted now)."""
    was, cond = st.get_condition(old, st.QUEUED), st.get_condition(new, st.QUEUED)
    waited = None
    if old.get("state") == st.QUEUED and new.get("state") != st.QUEUED and was is not None:
        since = parse_time(was.get("lastTransitionTime"))
        waited = (now - since).total_seconds() if since is not None else None
    evicted = None
    if cond is not None and cond.get("status") == "True" and cond.get("reason") == reasons.PREEMPTED and not (
            was is not None and was.get("status") == "True" and was.get("reason") == reasons.PREEMPTED):
        match = _EVICTED.match(str(cond.get("message") or ""))
        evicted = match[1] if match else "Unknown"
    return waited, evicted


def _conditions(obj: Mapping[str, Any], changes: Sequence[tuple[str, bool, str, str]], now: datetime) -> Obj:
    """Merge patch of a Workload's status conditions, each change set by the same rule as the job's own
    (status.set_condition: lastTransitionTime moves only when the status flips), conditional on the Workload's
    resourceVersion."""
    meta = obj.get("metadata") or {}
    conds = list((obj.get("status") or {}).get("conditions") or [])
    for ctype, status, reason, message in changes:
        conds = st.set_condition(conds, ctype, status, reason, message, now, int(meta.get("generation") or 0))
    return {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "status": {"conditions": conds}}


def clear_admission_patch(obj: Mapping[str, Any], reason: str, message: str, now: datetime) -> Obj:
    """Gives an evicted Workload's quota back once no pod of the job is active, as jobframework does
    (UnsetQuotaReservationWithCondition + SetRequeuedCondition): admission removed, QuotaReserved and Admitted
    False, Requeued True for a preemption, PodsReady False (admitted again, the job must start again in time)."""
    changes = [("QuotaReserved", False, reasons.PENDING, message),
               ("Admitted", False, reasons.NO_RESERVATION, "The workload has no reservation"),
               ("Requeued", reason in (reasons.PREEMPTED, reasons.NODE_FAILURES), reason, message)]
    if any(c.get("type") == "PodsReady" for c in (obj.get("status") or {}).get("conditions") or []):
        changes.append(("PodsReady", False, reasons.WAIT_FOR_START, "Not all pods are ready or succeeded"))
    patch = _conditions(obj, changes, now)
    patch["status"]["admission"] = None
    return patch


def pods_ready_patch(obj: Mapping[str, Any], ready: bool, reason: str, now: datetime) -> Obj:
    """The Workload's PodsReady condition (what Kueue's waitForPodsReady times), in Kueue's words."""
    message = ("All pods reached readiness and the workload is running" if ready
               else "Not all pods are ready or succeeded")
    return _conditions(obj, [("PodsReady", ready, reason, message)], now)


def finished_patch(obj: Mapping[str, Any], succeeded: bool, message: str, now: datetime) -> Obj:
    """Marks a Workload Finished (Kueue then releases its quota and leaves it alone)."""
    return _conditions(obj, [("Finished", True, st.SUCCEEDED if succeeded else st.FAILED, message)], now)

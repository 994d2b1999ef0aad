"""Suspend (spec.runPolicy.suspend) of a job in a Kueue queue: the Workload is deactivated, as Kueue's own way to stop
a job (Workload spec.active false), and activated again on resume.

Deleting the pods alone (what a suspend does without Kueue) would keep the admitted quota for as long as the job is
suspended, and on a MultiKueue manager it would change nothing: the job runs in a worker cluster. Deactivated, the
Workload is evicted by Kueue (reason Deactivated); once no pod of the job is active the operator gives the quota back
(gate.py's eviction path), and on a manager MultiKueue deactivates the worker's Workload (whose operator stops the
copy's pods, each writing its checkpoint on SIGTERM) and then deletes the copy. On resume the operator activates the
Workload again, Kueue requeues it (reason Reactivated) and the job waits to be admitted like any other.

Only a Workload the operator deactivated for a suspend (SUSPENDED_ANNOTATION) is activated again: one that Kueue
deactivated (a rejected admission check, too many requeues, MultiKueue's eviction on the manager) or an admin did
stays inactive, as Kueue's jobframework leaves it.
"""

from __future__ import annotations

from ddpjob_operator.api import reasons
from ddpjob_operator.planner.kueue import gate
from ddpjob_operator.planner.kueue.admission import WorkloadWrite
from ddpjob_operator.planner.kueue.workload import WorkloadView

SUSPENDED = "spec.runPolicy.suspend is true: the Workload is deactivated"
RESUMED = "spec.runPolicy.suspend is false: the Workload is active again"


def writes(workload: str, view: WorkloadView | None, *, suspended: bool, pods_active: bool) -> list[WorkloadWrite]:
    """The Workload writes of this pass for suspend and resume (none for a job with no Workload yet: the first one
    is created active, and deactivated on the next pass if the job is suspended)."""
    if view is None:
        return []
    if not suspended:
        if view.active or not view.suspended_by_job:
            return []
        return [WorkloadWrite(workload, "activate", reasons.RESUMED, RESUMED)]
    out = [] if not view.active else [WorkloadWrite(workload, "deactivate", reasons.SUSPENDED, SUSPENDED)]
    if (reason := gate.clear_now(view, pods_active=pods_active)) is not None:
        message = view.conditions[reasons.EVICTED].message
        out.append(WorkloadWrite(workload, "clear", reason, f"evicted by Kueue ({reason}): {message}; the job is "
                                 "suspended"))
    return out

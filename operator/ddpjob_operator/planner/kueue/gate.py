"""Queueing (Kueue): whether a job with a queue-name label may run its pods this pass, and what holds it.

A queued job runs pods only while its Workload is admitted and not evicted. Before the first admission, after an
eviction and when its Workload was deleted, it holds: its pods are deleted (gracefully: each worker writes its
final checkpoint on SIGTERM), and once none is active an evicted Workload's quota is given back (its admission
cleared), so Kueue can admit it again, or admit another job. Holding is not a failure: no incident, no backoff.
"""

from __future__ import annotations

import dataclasses

from ddpjob_operator.api import reasons
from ddpjob_operator.planner.kueue.workload import WorkloadView


@dataclasses.dataclass(frozen=True, slots=True)
class Gate:
    """This pass's verdict for a queued job."""

    run: bool
    """The Workload is admitted: run the pods (with its placement)."""
    reason: str
    message: str
    clear_admission: str | None = None
    """Give the quota back now (the eviction's reason): evicted, still holding quota, and no pod active."""


def clear_now(view: WorkloadView, *, pods_active: bool) -> str | None:
    """The eviction's reason when an evicted Workload's quota should be given back now: it still holds quota and no
    pod of the job is active (the pods first: each worker checkpoints on SIGTERM). None otherwise."""
    evicted = view.conditions.get(reasons.EVICTED)
    if evicted is None or not evicted.status:
        return None
    holding = view.cluster_queue is not None or view.true("QuotaReserved")
    return evicted.reason if holding and not pods_active else None


def decide(workload: str, queue: str, view: WorkloadView | None, *, pods_active: bool,
           priority_missing: str | None = None) -> Gate:
    """The gate of a job in LocalQueue ``queue`` whose Workload ``workload`` looks like ``view`` (None: it does not
    exist, or is being deleted)."""
    if priority_missing is not None:
        return Gate(False, reasons.PRIORITY_CLASS_NOT_FOUND, priority_missing)
    if view is None:
        return Gate(False, reasons.WORKLOAD_CREATED, f"waiting for Kueue: Workload {workload} created in LocalQueue "
                    f"{queue}{'; its pods were stopped' if pods_active else ''}")
    evicted = view.conditions.get(reasons.EVICTED)
    if evicted is not None and evicted.status:
        then = ("stopping its pods (each worker checkpoints on SIGTERM)" if pods_active
                else "waiting to be admitted again")
        return Gate(False, reasons.PREEMPTED,  # the eviction's own reason is in the message
                    f"evicted by Kueue ({evicted.reason}): {evicted.message}; {then}",
                    clear_admission=clear_now(view, pods_active=pods_active))
    if view.true("Finished"):
        finished = view.conditions["Finished"]
        return Gate(False, reasons.WORKLOAD_FINISHED, f"Workload {workload} is Finished ({finished.reason}: "
                    f"{finished.message}); delete it to queue the job again")
    if view.admitted:
        return Gate(True, reasons.ADMITTED, f"admitted by Kueue: Workload {workload}")
    reserved = view.conditions.get("QuotaReserved")
    if reserved is not None and reserved.status:
        return Gate(False, reasons.ADMISSION_CHECKS_PENDING, f"quota reserved in ClusterQueue {view.cluster_queue}; "
                    f"waiting for its admission checks ({view.conditions.get('Admitted', reserved).message})")
    if reserved is not None:  # Kueue's own words: no such LocalQueue, not enough quota, a stopped queue ...
        return Gate(False, reserved.reason or reasons.PENDING, f"Kueue: {reserved.message}")
    return Gate(False, reasons.PENDING, f"waiting for Kueue to consider Workload {workload} in LocalQueue {queue}")

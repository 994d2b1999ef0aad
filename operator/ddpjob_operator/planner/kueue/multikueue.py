"""A DDPJob on a MultiKueue manager cluster (spec.managedBy: kueue.x-k8s.io/multikueue): of a pass, only its Workload.

Kueue's MultiKueue admits the job's Workload on the manager through its admission check, creates a copy of the job
(without managedBy, labelled with the Workload's name) in the worker cluster that reserved quota, and copies that
copy's status back here whole (Kueue's generic custom-job adapter). The operator of the worker cluster runs the copy.
Here the operator does only what Kueue's jobframework does for a job it does not run itself: it creates the Workload
(owned by the job, so deleting the job deletes it and MultiKueue then deletes the copy), and gives the quota back
after an eviction (MultiKueue then deletes the copy and dispatches the job again), and deactivates it while the job is
suspended (kueue/suspension.py). No pod, Service or status write: the status is the worker cluster's, except a
suspended job's. MultiKueue marks the Workload Finished itself when the copy's is.
"""

from __future__ import annotations

import dataclasses

from ddpjob_operator.planner.kueue.workload import WORKLOAD
from ddpjob_operator.planner.types import Plan

#: The Workload writes a manager makes: the quota given back after an eviction, and a suspend's (de)activation.
_MANAGER_WRITES = frozenset({"clear", "deactivate", "activate"})


def dispatched(plan: Plan) -> Plan:
    """What a manager cluster's pass carries out of ``plan``: its Workload's create, the quota given back after an
    eviction, a suspend's deactivation (MultiKueue then stops and deletes the copy) and the TTL's delete of a finished
    job; nothing else (docs/scheduling.md, "More than one cluster"). The status is the copy's, but a suspended job has
    no copy, or one about to go: its status says Suspended, written here."""
    suspended = plan.job is not None and plan.job.spec.run_policy.suspend
    return dataclasses.replace(
        Plan(), job=plan.job, status=plan.status, dispatch_only=True, requeue_after=plan.requeue_after,
        ensure=[obj for obj in plan.ensure if obj["kind"] == WORKLOAD], patch=plan.patch if suspended else {},
        workload_writes=[w for w in plan.workload_writes if w.op in _MANAGER_WRITES], delete_job=plan.delete_job)

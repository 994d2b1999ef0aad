"""The operator's Kueue reads and writes around a pass: before it, the job's WorkloadPriorityClass (to build its
Workload) and its admission's ResourceFlavors (to place its pods), both kept in the job's memory; after it, the
Workload writes the plan asks for (give the quota back after an eviction, mark it Finished, own a prebuilt one,
deactivate it for a suspend)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from ddpjob_operator.api.spec import DDPJob
from ddpjob_operator.kube.client import API_VERSIONS, Kube, adopt
from ddpjob_operator.planner.kueue import admission
from ddpjob_operator.planner.kueue import workload as kueue
from ddpjob_operator.planner.kueue.admission import KueueInputs, WorkloadWrite
from ddpjob_operator.planner.observation import ChildView
from ddpjob_operator.runtime.memory import JobMemory

log = logging.getLogger("ddpjob.kueue")
_GROUP_VERSION = API_VERSIONS[kueue.WORKLOAD]
#: Writes to the Workload object rather than its status: its owner, and spec.active.
_OBJECT_OPS = frozenset({"adopt", "deactivate", "activate"})


async def read_inputs(kube: Kube, job: DDPJob, children: Mapping[tuple[str, str], ChildView],
                      mem: JobMemory) -> KueueInputs:
    """What the pass of a queued job needs from the API besides its children (nothing for other jobs)."""
    if kueue.queue_name(job) is None:
        return KueueInputs()
    view = admission.workload_view(job, children)
    priority, missing = None, None
    name = job.labels.get(kueue.PRIORITY_LABEL)
    if name:
        if view is None and (mem.priority is None or mem.priority[0] != name or mem.priority[1] is None):
            obj = await kube.get_cluster_scoped(_GROUP_VERSION, "workloadpriorityclasses", name)
            mem.priority = (name, None if obj is None else int(obj.get("value") or 0))
        if mem.priority is not None and mem.priority[1] is not None:
            priority = (name, mem.priority[1])
        elif view is None:
            missing = (f"metadata.labels[{kueue.PRIORITY_LABEL}] names WorkloadPriorityClass {name!r}, which does "
                       "not exist (fix: create it, or remove the label); the job is not queued until it exists")
    if view is None or not view.admitted:
        mem.flavors = {}  # read again at the next admission: a flavor's labels may change between two
    else:
        for flavor in kueue.flavor_names(view):
            if flavor not in mem.flavors:
                obj = await kube.get_cluster_scoped(_GROUP_VERSION, "resourceflavors", flavor)
                mem.flavors[flavor] = dict((obj or {}).get("spec") or {})
    return KueueInputs(priority=priority, priority_missing=missing, flavors=dict(mem.flavors))


async def write(kube: Kube, job: Mapping[str, Any], writes: Sequence[WorkloadWrite], now: datetime) -> None:
    """Carry out the plan's Workload writes for the DDPJob ``job``: read the Workload, patch its status (its owner,
    for "adopt") conditionally on what was read (a Workload changed meanwhile is left for the next pass)."""
    namespace = str(job["metadata"].get("namespace") or "")
    for w in writes:
        obj = await kube.get(_GROUP_VERSION, kueue.WORKLOAD, namespace, w.name)
        if obj is None:
            continue
        on_object = w.op in _OBJECT_OPS
        patch = _owned(obj, job) if w.op == "adopt" else _activity(obj, w.op) if on_object else _patch(obj, w, now)
        if await kube.patch_workload(namespace, w.name, patch, status=not on_object):
            done = {"clear": "quota given back", "podsready": f"PodsReady={w.succeeded}", "finish": "marked Finished",
                    "adopt": "owned by its job", "deactivate": "deactivated", "activate": "active again"}
            log.info("workload=%s/%s %s (%s)", namespace, w.name, done[w.op], w.reason)


def _owned(obj: Mapping[str, Any], job: Mapping[str, Any]) -> dict[str, Any]:
    """Merge patch: the Workload's ownerReferences plus the job as its controller (a prebuilt Workload has none)."""
    meta = obj.get("metadata") or {}
    refs = adopt({"metadata": {"ownerReferences": list(meta.get("ownerReferences") or [])}}, job)
    return {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                         "ownerReferences": refs["metadata"]["ownerReferences"]}}


def _activity(obj: Mapping[str, Any], op: str) -> dict[str, Any]:
    """Merge patch: spec.active for a suspend ("deactivate", marked as the operator's) or a resume ("activate")."""
    meta = obj.get("metadata") or {}
    mark = "true" if op == "deactivate" else None
    return {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                         "annotations": {kueue.SUSPENDED_ANNOTATION: mark}},
            "spec": {"active": op == "activate"}}


def _patch(obj: Mapping[str, Any], w: WorkloadWrite, now: datetime) -> dict[str, Any]:
    if w.op == "clear":
        return admission.clear_admission_patch(obj, w.reason, w.message, now)
    if w.op == "podsready":
        return admission.pods_ready_patch(obj, w.succeeded, w.reason, now)
    return admission.finished_patch(obj, w.succeeded, w.message, now)

"""Kueue: the Workload of a queued DDPJob, and what its admission means for the pods. Pure: dicts in, dicts out.

Kueue runs no reconciler for a kind it knows only as an external framework (``integrations.externalFrameworks``):
the operator does for DDPJob what Kueue's jobframework does for the kinds built into Kueue. It creates the Workload
(owned by the job, so it goes with it), creates no pod until Kueue admits it, gives the pods the admitted flavors'
node labels and tolerations, stops the pods when Kueue evicts it and then gives the quota back (clears the
admission), and marks the Workload Finished when the job ends. docs/scheduling.md, "Kueue".
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Any

from ddpjob_operator.api import names
from ddpjob_operator.api.spec import GROUP, KIND, DDPJob
from ddpjob_operator.api.spec import QUEUE_LABEL as QUEUE_LABEL  # the job's LocalQueue; spec.py checks it too

Obj = dict[str, Any]

API_VERSION = "kueue.x-k8s.io/v1beta2"
WORKLOAD = "Workload"
#: The label naming a WorkloadPriorityClass (Kueue's own).
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
#: Kueue's label for the owner job's UID on a Workload.
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
#: Kueue's label naming a Workload made for the job before the job existed: MultiKueue puts it on the copy of a job it
#: creates in a worker cluster, whose Workload it created there first (jobframework's "prebuilt workload").
PREBUILT_LABEL = "kueue.x-k8s.io/prebuilt-workload-name"
#: On a Workload the operator deactivated because its job was suspended (spec.runPolicy.suspend): only such a
#: Workload is activated again when the job resumes; one that Kueue or an admin deactivated stays as they left it.
SUSPENDED_ANNOTATION = f"{GROUP}/suspended"
#: Pod sets of a DDPJob's Workload: the worker pods (spares included) and the rendezvous pod.
WORKERS, RENDEZVOUS = "workers", "rendezvous"


def queue_name(job: DDPJob) -> str | None:
    """The LocalQueue the job waits in, or None for a job Kueue does not manage."""
    return job.labels.get(QUEUE_LABEL) or None


def prebuilt(job: DDPJob) -> str | None:
    """The name of the Workload Kueue made for the job before it existed (MultiKueue's copy in a worker cluster)."""
    return job.labels.get(PREBUILT_LABEL) or None


def workload_name(job: DDPJob) -> str:
    """The prebuilt Workload's name if Kueue made one; else ``ddpjob-<job>-<hash>``, as Kueue names the Workload of
    the kinds it knows: the job's UID is in the hash, so a job created again under the same name never meets its
    predecessor's Workload."""
    if (name := prebuilt(job)) is not None:
        return name
    digest = hashlib.sha1(f"{KIND}\n{GROUP}\n{job.name}\n{job.uid}".encode()).hexdigest()
    return f"{KIND.lower()}-{job.name}-{digest[:5]}"


def _template(pod: Obj) -> Obj:
    """A pod set's template: what Kueue reads to count quota and to match flavors (requests, node selector,
    affinity, tolerations, priority), without the env contract and volumes the pods also carry."""
    spec = copy.deepcopy(pod["spec"])
    for c in [*spec.get("containers", []), *spec.get("initContainers", [])]:
        for key in ("env", "volumeMounts", "readinessProbe", "livenessProbe", "startupProbe"):
            c.pop(key, None)
    spec.pop("volumes", None)
    return {"metadata": {"labels": dict(pod["metadata"].get("labels") or {})}, "spec": spec}


def build_workload(job: DDPJob, worker_pod: Obj, rdzv_pod: Obj, priority: tuple[str, int] | None) -> Obj:
    """The job's Workload: the workers (count = workers + spares; an elastic job may be admitted with as few as
    elastic.minReplicas) and the rendezvous pod, in its LocalQueue, with its WorkloadPriorityClass if any."""
    workers: Obj = {"name": WORKERS, "count": job.spec.pod_count, "template": _template(worker_pod)}
    if job.spec.elastic is not None and job.spec.min_replicas < job.spec.pod_count:
        workers["minCount"] = job.spec.min_replicas
    spec: Obj = {"queueName": queue_name(job), "podSets": [
        workers, {"name": RENDEZVOUS, "count": 1, "template": _template(rdzv_pod)}]}
    if priority is not None:
        spec["priorityClassRef"] = {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": priority[0]}
        spec["priority"] = priority[1]
    return {
        "apiVersion": API_VERSION,
        "kind": WORKLOAD,
        "metadata": {"name": workload_name(job), "namespace": job.namespace,
                     "labels": {**names.job_labels(job.name), JOB_UID_LABEL: job.uid}},
        "spec": spec,
    }


@dataclasses.dataclass(frozen=True, slots=True)
class Placement:
    """Where Kueue put one pod set: how many pods, the flavor of each resource, and what the pods must carry."""

    count: int
    flavors: Mapping[str, str]
    node_selector: Mapping[str, str] = dataclasses.field(default_factory=dict)
    tolerations: tuple[Obj, ...] = ()
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class Condition:
    status: bool
    reason: str
    message: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadView:
    """What the planner needs of a Workload."""

    conditions: Mapping[str, Condition]
    cluster_queue: str | None
    """The ClusterQueue that reserved quota (None: no reservation)."""
    assignments: Mapping[str, tuple[int | None, Mapping[str, str]]]
    """Pod set -> (admitted count, resource -> flavor)."""
    updates: Mapping[str, Obj]
    """Pod set -> the admission checks' podSetUpdates merged (labels, annotations, nodeSelector, tolerations)."""
    active: bool = True
    """spec.active: False once deactivated (Kueue then evicts it and admits it no more until it is active again)."""
    suspended_by_job: bool = False
    """The operator deactivated it because the job was suspended (SUSPENDED_ANNOTATION)."""

    def true(self, ctype: str) -> bool:
        cond = self.conditions.get(ctype)
        return cond is not None and cond.status

    @property
    def admitted(self) -> bool:
        return self.true("Admitted") and self.cluster_queue is not None and not self.true("Evicted")

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> WorkloadView:
        status = obj.get("status") or {}
        conds = {str(c.get("type")): Condition(c.get("status") == "True", str(c.get("reason") or ""),
                                               str(c.get("message") or "")) for c in status.get("conditions") or []}
        admission = status.get("admission") or {}
        assignments = {str(a.get("name")): (a.get("count"), dict(a.get("flavors") or {}))
                       for a in admission.get("podSetAssignments") or []}
        updates: dict[str, Obj] = {}
        for check in status.get("admissionChecks") or []:
            for u in check.get("podSetUpdates") or []:
                merged = updates.setdefault(str(u.get("name")), {})
                for key in ("labels", "annotations", "nodeSelector"):
                    merged.setdefault(key, {}).update(u.get(key) or {})
                merged.setdefault("tolerations", []).extend(u.get("tolerations") or [])
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        return cls(conditions=conds, cluster_queue=admission.get("clusterQueue"), assignments=assignments,
                   updates=updates, active=(obj.get("spec") or {}).get("active") is not False,
                   suspended_by_job=annotations.get(SUSPENDED_ANNOTATION) == "true")


def placement(view: WorkloadView, pod_set: str, flavors: Mapping[str, Obj], default_count: int) -> Placement:
    """Pod set ``pod_set``'s placement: its flavors' nodeLabels and tolerations (``flavors``: ResourceFlavor specs
    by name), then its admission checks' podSetUpdates, as jobframework merges them into the pod template."""
    count, by_resource = view.assignments.get(pod_set, (None, {}))
    selector: dict[str, str] = {}
    tolerations: list[Obj] = []
    for name in sorted(set(by_resource.values())):
        spec = flavors.get(name) or {}
        selector.update(spec.get("nodeLabels") or {})
        tolerations += [t for t in spec.get("tolerations") or [] if t not in tolerations]
    update = view.updates.get(pod_set) or {}
    selector.update(update.get("nodeSelector") or {})
    tolerations += [t for t in update.get("tolerations") or [] if t not in tolerations]
    return Placement(count=default_count if count is None else int(count), flavors=dict(by_resource),
                     node_selector=selector, tolerations=tuple(tolerations), labels=update.get("labels") or {},
                     annotations=update.get("annotations") or {})


def place_pod(pod: Obj, where: Placement) -> Obj:
    """``pod`` with its pod set's placement merged in (Kueue's flavor wins over the template on a clash: the quota
    was counted on that flavor's nodes)."""
    spec = pod["spec"]
    if where.node_selector:
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **where.node_selector}
    if where.tolerations:
        own = list(spec.get("tolerations") or [])
        spec["tolerations"] = own + [dict(t) for t in where.tolerations if t not in own]
    meta = pod["metadata"]
    if where.labels:
        meta["labels"] = {**where.labels, **(meta.get("labels") or {})}  # never over the operator's own labels
    if where.annotations:
        meta["annotations"] = {**(meta.get("annotations") or {}), **where.annotations}
    return pod


def flavor_names(view: WorkloadView | None) -> list[str]:
    """The ResourceFlavors an admission names (to read their node labels and tolerations)."""
    if view is None:
        return []
    return sorted({f for _, by_resource in view.assignments.values() for f in by_resource.values()})


def describe(view: WorkloadView) -> str:
    """"ClusterQueue cq; workers: 3 pods, cpu=spot; rendezvous: 1 pod, cpu=spot"."""
    parts = [f"ClusterQueue {view.cluster_queue}"]
    for name, (count, by_resource) in sorted(view.assignments.items(), reverse=True):
        flavors = ", ".join(f"{r}={f}" for r, f in sorted(by_resource.items())) or "no flavor"
        parts.append(f"{name}: {count if count is not None else '-'} pod(s), {flavors}")
    return "; ".join(parts)

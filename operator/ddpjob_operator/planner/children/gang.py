"""Gang scheduling: the PodGroup of a job with spec.scheduling.gang, and what its pods carry to join it.

scheduler-plugins' coscheduling plugin admits a pod only when its PodGroup (named by the pod's
``scheduling.x-k8s.io/pod-group`` label) has at least ``minMember`` pods and the cluster has room for
``minResources``; placed members wait at Permit until the whole quorum is placed, and are released together after
``scheduleTimeoutSeconds``. The quorum is every worker the job needs to train (minReplicas: all of them for a fixed
job) plus the rendezvous pod, which every worker waits for. Pure: dicts in, dicts out.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from ddpjob_operator.api import names
from ddpjob_operator.api.quantity import parse_quantity
from ddpjob_operator.api.spec import POD_GROUP_LABEL, DDPJob

Obj = dict[str, Any]

POD_GROUP_API_VERSION = "scheduling.x-k8s.io/v1alpha1"
POD_GROUP_KIND = "PodGroup"


def join(job: DDPJob, pod: Obj) -> Obj:
    """Put a pod built for ``job`` into its gang (label + schedulerName); a job without a gang is left alone."""
    gang = job.spec.scheduling.gang
    if gang is None:
        return pod
    pod["metadata"].setdefault("labels", {})[POD_GROUP_LABEL] = names.pod_group_name(job.name)
    pod["spec"]["schedulerName"] = gang.scheduler_name
    return pod


def _container_requests(container: Obj) -> dict[str, Decimal]:
    # What the API server stores: a resource with only a limit gets the limit as its request.
    resources = container.get("resources") or {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {str(k): parse_quantity(v) for k, v in merged.items()}


def pod_requests(pod_spec: Obj) -> dict[str, Decimal]:
    """What the scheduler reserves for a pod: the sum over its containers, or the largest init container if
    that is more (they run one at a time, before the others)."""
    total: dict[str, Decimal] = {}
    for c in pod_spec.get("containers") or []:
        for k, v in _container_requests(c).items():
            total[k] = total.get(k, Decimal(0)) + v
    for c in pod_spec.get("initContainers") or []:
        for k, v in _container_requests(c).items():
            total[k] = max(total.get(k, Decimal(0)), v)
    return total


def _quantity(value: Decimal) -> str:
    """A canonical quantity: whole units when whole, else milli-units rounded up (cpu: 4050m)."""
    if value == value.to_integral_value():
        return str(int(value))
    milli = (value * 1000).to_integral_value(rounding="ROUND_CEILING")
    return f"{int(milli)}m"


def min_member(job: DDPJob) -> int:
    """Workers the job needs to train, plus the rendezvous pod."""
    return job.spec.min_replicas + 1


def min_resources(worker_spec: Obj, rdzv_spec: Obj, workers: int) -> dict[str, str]:
    """What ``workers`` workers and the rendezvous pod request together (empty resources are left out)."""
    total = {k: v * workers for k, v in pod_requests(worker_spec).items()}
    for k, v in pod_requests(rdzv_spec).items():
        total[k] = total.get(k, Decimal(0)) + v
    return {k: _quantity(v) for k, v in sorted(total.items()) if v > 0}


def build_pod_group(job: DDPJob, worker_pod: Obj, rdzv_pod: Obj) -> Obj:
    """The job's PodGroup (spec.scheduling.gang is set). ``worker_pod``/``rdzv_pod``: the pods as built (the
    builder's defaults included), so minResources is what the scheduler will really be asked for."""
    gang = job.spec.scheduling.gang
    assert gang is not None, "a PodGroup only for spec.scheduling.gang"
    spec: Obj = {"minMember": min_member(job), "scheduleTimeoutSeconds": gang.schedule_timeout_seconds}
    resources = min_resources(worker_pod["spec"], rdzv_pod["spec"], job.spec.min_replicas)
    if resources:
        spec["minResources"] = resources
    return {
        "apiVersion": POD_GROUP_API_VERSION,
        "kind": POD_GROUP_KIND,
        "metadata": {"name": names.pod_group_name(job.name), "namespace": job.namespace,
                     "labels": names.job_labels(job.name)},
        "spec": spec,
    }

"""Checks of a DDPJob's pod template that a schema cannot express: what the API server accepts but a worker could
only fail on at start, refused before any pod exists with the field named (spec.DDPJobSpec runs them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddpjob_worker import restart_request
from ddpjob_worker.contract import (
    RUNTIME_INIT_CONTAINER,
    RUNTIME_MOUNT_PATH,
    RUNTIME_VOLUME,
    USER_SETTABLE_ENV,
    injected_command,
    knob_error,
    reserved_env,
)

from ddpjob_operator.api.quantity import resources_error
from ddpjob_operator.api.spec import CHECKPOINT_VOLUME, GROUP, POD_GROUP_LABEL, worker_container_index

if TYPE_CHECKING:
    from ddpjob_operator.api.spec import DDPJobSpec


def _gpu_requested(pod_spec: dict[str, Any], container: dict[str, Any]) -> bool:
    resources = container.get("resources") or {}
    limits = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
    env = {e.get("name") for e in container.get("env") or [] if isinstance(e, dict)}
    return (any(str(k).endswith("/gpu") for k in limits) or bool(resources.get("claims"))
            or bool(pod_spec.get("resourceClaims")) or "NVIDIA_VISIBLE_DEVICES" in env)


#: The fields of a PodTemplateSpec and of its metadata (ObjectMeta). The pod API checks the spec's own fields when the
#: operator dry-runs a pod (runtime/pod_check.py); what the operator builds a pod without (a typo above the spec,
#: ``lables``) would vanish without a word.
_TEMPLATE_FIELDS = ("metadata", "spec")
_OBJECT_META_FIELDS = ("name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
                       "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations",
                       "ownerReferences", "finalizers", "managedFields")


def _check_template_fields(template: dict[str, Any]) -> None:
    """A typo in the template's own fields or its metadata's is an error naming the field, not a dropped value."""
    for key in template:
        if key not in _TEMPLATE_FIELDS:
            raise ValueError(f"template.{key}: unknown field; a pod template has metadata and spec")
    for key in template.get("metadata") or {}:
        if key not in _OBJECT_META_FIELDS:
            raise ValueError(f"template.metadata.{key}: unknown field; the operator copies labels and annotations "
                             "to the pods")


def check_template(spec: DDPJobSpec) -> None:
    """What the API server accepts but a worker could only fail on at start: refuse it before any pod exists."""
    _check_template_fields(spec.template)
    pod_spec = spec.template.get("spec") or {}
    containers: list[dict[str, Any]] = pod_spec.get("containers") or []
    ci = worker_container_index(containers)
    worker = containers[ci]
    where = f"template.spec.containers[{ci}]"
    for j, item in enumerate(worker.get("env") or []):
        name = str((item or {}).get("name") or "")
        if reserved_env(name):
            raise ValueError(f"{where}.env[{j}].name: {name} is set by the operator or torchrun in every worker "
                             "(env contract, docs/api.md); remove it (for torchrun options use the DDPJob fields)")
        value = (item or {}).get("value")
        problem = knob_error(name, str(value)) if name in USER_SETTABLE_ENV and value is not None else None
        if problem:  # ddp-worker would exit 78 at start, on every pod
            raise ValueError(f"{where}.env[{j}].value: {problem}")
    for j, vol in enumerate(pod_spec.get("volumes") or []):
        purpose = {CHECKPOINT_VOLUME: "spec.checkpoint", RUNTIME_VOLUME: "the injected runtime",
                   restart_request.RESTART_VOLUME: "restarts in place (onStall: RestartGroup)"}.get(
            str((vol or {}).get("name")))
        if purpose:
            raise ValueError(f"template.spec.volumes[{j}].name: the volume name {vol['name']!r} is reserved for "
                             f"{purpose}; rename your volume")
    if spec.runtime.mode == "Inject":
        _check_injectable(pod_spec, worker, where)
    mount = spec.checkpoint.mount_path.rstrip("/")
    for j, m in enumerate(worker.get("volumeMounts") or []):
        path = str((m or {}).get("mountPath") or "").rstrip("/")
        if path == mount:
            raise ValueError(f"{where}.volumeMounts[{j}].mountPath: {mount} is spec.checkpoint.mountPath, where "
                             "the operator mounts the checkpoint volume; mount this volume elsewhere")
        if path == restart_request.RESTART_MOUNT_PATH:
            raise ValueError(f"{where}.volumeMounts[{j}].mountPath: {path} is where the operator mounts the "
                             "restart requests of onStall: RestartGroup; mount this volume elsewhere")
    _check_gang(spec, pod_spec)
    _check_resources(pod_spec)
    _check_overridden(spec, pod_spec)
    if spec.nproc_per_node == "gpu" and not _gpu_requested(pod_spec, worker):
        raise ValueError(f"nprocPerNode: 'gpu' starts one process per GPU, but {where} requests no GPU: add "
                         "resources.limits['nvidia.com/gpu'] (or a DRA resource claim), or use nprocPerNode: cpu")


def _check_injectable(pod_spec: dict[str, Any], worker: dict[str, Any], where: str) -> None:
    """What injecting the runtime needs from the template: a training command, and the runtime's names free."""
    if not injected_command(worker.get("command"), worker.get("args")):
        raise ValueError(f"{where}.command: no training command; set it, e.g. command: [python, train.py] (the "
                         "operator runs it under torchrun with the injected runtime)")
    for j, m in enumerate(worker.get("volumeMounts") or []):
        if str((m or {}).get("mountPath") or "").rstrip("/") == RUNTIME_MOUNT_PATH:
            raise ValueError(f"{where}.volumeMounts[{j}].mountPath: {RUNTIME_MOUNT_PATH} is where the operator "
                             "mounts the injected runtime; mount this volume elsewhere")
    for j, c in enumerate(pod_spec.get("initContainers") or []):
        if (c or {}).get("name") == RUNTIME_INIT_CONTAINER:
            raise ValueError(f"template.spec.initContainers[{j}].name: {RUNTIME_INIT_CONTAINER!r} is the operator's "
                             "init container that copies the runtime; rename yours")


def _check_gang(spec: DDPJobSpec, pod_spec: dict[str, Any]) -> None:
    """A gang job's pods must all go to the gang scheduler, in the job's own PodGroup."""
    labels = (spec.template.get("metadata") or {}).get("labels") or {}
    if POD_GROUP_LABEL in labels:
        raise ValueError(f"template.metadata.labels: {POD_GROUP_LABEL} is set by the operator (spec.scheduling.gang "
                         "puts every pod in the job's own PodGroup); remove it")
    gang = spec.scheduling.gang
    own = pod_spec.get("schedulerName")
    if gang is not None and own and own != gang.scheduler_name:
        raise ValueError(f"template.spec.schedulerName: {own!r} differs from spec.scheduling.gang.schedulerName "
                         f"({gang.scheduler_name!r}); a gang needs one scheduler for all its pods: remove it from "
                         "the template or set the same name in both")


def _check_resources(pod_spec: dict[str, Any]) -> None:
    """Every container's requests and limits: the template is free-form in the CRD, and a bad quantity there was
    first parsed by the planner (a gang's minResources: a retry loop with no condition) or refused pod by pod."""
    for part in ("initContainers", "containers"):
        for j, container in enumerate(pod_spec.get(part) or []):
            problem = resources_error((container or {}).get("resources"))
            if problem:
                raise ValueError(f"template.spec.{part}[{j}].resources{problem}")


#: Pod fields the operator sets on every worker, and why a template value could only be ignored.
_OVERRIDDEN = {
    "hostname": "each worker's host name is its pod name (the rendezvous and DNS use it)",
    "subdomain": "the workers' subdomain is the job's headless Service",
}


def _check_overridden(spec: DDPJobSpec, pod_spec: dict[str, Any]) -> None:
    """A value the operator would overwrite without a word is refused instead, naming the field."""
    policy = pod_spec.get("restartPolicy")
    if policy is not None and policy != "Never":
        raise ValueError(f"template.spec.restartPolicy: {policy!r} is not used: worker pods run with restartPolicy "
                         "Never (torchrun restarts the trainers in place, the operator replaces the pod); remove it "
                         "and use spec.maxRestarts and spec.runPolicy")
    for key, why in _OVERRIDDEN.items():
        if key in pod_spec:
            raise ValueError(f"template.spec.{key}: set by the operator ({why}); remove it")
    labels = (spec.template.get("metadata") or {}).get("labels") or {}
    own = sorted(k for k in labels if str(k).startswith(f"{GROUP}/"))
    if own:
        raise ValueError(f"template.metadata.labels: {own[0]} is the operator's own label (it names the job, the "
                         f"replica and its generation on every pod); remove it")

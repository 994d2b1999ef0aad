"""The typed DDPJob spec: parsed once at the boundary (operator handlers and `ddpjob run`), so every later
step works on validated values. The CRD's OpenAPI schema and CEL rules reject most bad input at the API
server; this model catches what a schema cannot express and gives the same clear, field-named messages
to local runs, which have no API server."""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Literal

from ddpjob_worker.contract import injected_command, python_target, training_command
from pydantic import Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from ddpjob_operator.api.base import DNS_SUBDOMAIN as _DNS_SUBDOMAIN
from ddpjob_operator.api.base import Model as _Model
from ddpjob_operator.api.checkpointing import Checkpoint
from ddpjob_operator.api.quantity import resources_error

GROUP = "ddpjob.io"
VERSION = "v1alpha1"
KIND = "DDPJob"
PLURAL = "ddpjobs"
API_VERSION = f"{GROUP}/{VERSION}"
#: spec.managedBy of a job this operator runs (also what an absent field means), as batch/v1 Job's managedBy.
OPERATOR_MANAGER = f"{GROUP}/operator"
#: spec.managedBy of a job that Kueue's MultiKueue dispatches to a worker cluster (its generic custom-job adapter).
MULTIKUEUE_MANAGER = "kueue.x-k8s.io/multikueue"
#: A domain-prefixed path, as batch/v1 Job's managedBy: ``<dns-subdomain>/<name>``.
MANAGED_BY_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"

#: Longest DDPJob name: pods are named ``<name>-worker-<index>`` and that name is also the pod's host name,
#: a DNS label of at most 63 characters (the CRD enforces the same bound).
MAX_NAME_LENGTH = 45
_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
#: What a pattern means, for messages: pydantic would print the regular expression.
_PATTERN_WORDS = {
    _DNS_SUBDOMAIN: "must be a Kubernetes object name: lowercase letters, digits, '-' and '.', starting and ending "
                    "with a letter or digit",
    r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$": "must be a quantity such as 10Gi or 500Mi",
    r"^/": "must be an absolute path (start with /)",
    MANAGED_BY_PATTERN: "must be a domain-prefixed path such as kueue.x-k8s.io/multikueue (absent: this operator)",
}
_NAMED_RE = re.compile(r"^([A-Za-z][\w.\[\]/-]*): (.+)$", re.S)

#: The container in the pod template that runs torchrun; a template with one container may leave it unnamed.
WORKER_CONTAINER = "worker"
#: The pod volume the operator adds for checkpoints; a template may not define its own volume of that name.
CHECKPOINT_VOLUME = "checkpoints"


def manager_of(body: Mapping[str, Any]) -> str | None:
    """The controller that manages a DDPJob object instead of this operator (its spec.managedBy), or None when this
    operator does. Read from the raw body: a job managed elsewhere is not ours to parse or judge."""
    spec = body.get("spec")
    value = spec.get("managedBy") if isinstance(spec, Mapping) else None
    return None if value in (None, "", OPERATOR_MANAGER) else str(value)


def managed_elsewhere(body: Mapping[str, Any]) -> str | None:
    """The controller that runs the job so that this operator neither plans nor judges it: any spec.managedBy but
    MultiKueue's, whose manager cluster gets the job's Workload from this operator (kueue/multikueue.py)."""
    manager = manager_of(body)
    return None if manager == MULTIKUEUE_MANAGER else manager


class InvalidSpec(ValueError):
    """A DDPJob spec the operator cannot run; ``field`` is its path (``spec.elastic.maxReplicas``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class Elastic(_Model):
    """Elastic range: torchrun runs with ``--nnodes=minReplicas:maxReplicas``."""

    min_replicas: int = Field(ge=1, description="Fewest workers the job keeps training with.")
    max_replicas: int = Field(ge=1, description="Most workers; the scale subresource may not go above it.")


#: The rendezvous pod's resources unless spec.rendezvous.resources says otherwise: the store holds only rendezvous
#: keys (tens of MB); a CPU limit so that a namespace whose quota counts limits.cpu admits it.
RENDEZVOUS_RESOURCES: dict[str, dict[str, str]] = {
    "requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}}
#: What the rendezvous pod may ask for: a pure-Python store has no use for accelerators or hugepages.
RENDEZVOUS_RESOURCE_NAMES = ("cpu", "memory", "ephemeral-storage")


class Rendezvous(_Model):
    """The c10d rendezvous store (served by the job's rendezvous pod) and where that pod runs: its own scheduling,
    never the workers' (a store on a GPU node would hold that node, or keep an autoscaled one alive)."""

    port: int = Field(default=29400, ge=1024, le=65535)
    join_timeout_seconds: int = Field(default=600, ge=1)
    last_call_seconds: int = Field(default=15, ge=0)
    close_timeout_seconds: int = Field(default=60, ge=1)
    peer_timeout_seconds: int = Field(default=5, ge=0, le=600)
    node_selector: dict[str, str] | None = None
    tolerations: tuple[dict[str, Any], ...] | None = None
    affinity: dict[str, Any] | None = None
    priority_class_name: str | None = Field(default=None, max_length=253, pattern=_DNS_SUBDOMAIN)
    resources: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _resources(self) -> Rendezvous:
        if self.resources is None:
            return self
        extra = sorted(set(self.resources) - {"requests", "limits"})
        if extra:
            raise ValueError(f"resources.{extra[0]}: unknown; the rendezvous pod takes requests and limits only")
        problem = resources_error(self.resources)
        if problem:
            raise ValueError(f"resources{problem}")
        for part in ("requests", "limits"):
            for name in self.resources.get(part) or {}:
                if name not in RENDEZVOUS_RESOURCE_NAMES:
                    raise ValueError(f"resources.{part}.{name}: the rendezvous store uses only "
                                     f"{', '.join(RENDEZVOUS_RESOURCE_NAMES)}; remove {name}")
        return self

    @property
    def pod_resources(self) -> dict[str, dict[str, str]]:
        """The rendezvous container's resources: what the spec sets, as a container's (replacing the defaults
        whole: merged defaults could put a default limit below a request the user raised), else the defaults."""
        given = self.resources if self.resources is not None else RENDEZVOUS_RESOURCES
        return {part: {str(k): str(v) for k, v in given[part].items()} for part in ("requests", "limits")
                if given.get(part)}


#: The label that puts a job in a Kueue LocalQueue (Kueue's own, on every kind it queues; planner/kueue/workload.py).
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: Pods of a gang job carry this label naming their PodGroup (scheduler-plugins' coscheduling reads it).
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
#: The scheduler name scheduler-plugins' Helm chart gives its second scheduler.
DEFAULT_GANG_SCHEDULER = "scheduler-plugins-scheduler"


class Gang(_Model):
    """All workers or none: a PodGroup for a coscheduling scheduler (docs/scheduling.md)."""

    scheduler_name: str = Field(default=DEFAULT_GANG_SCHEDULER, max_length=253, pattern=_DNS_SUBDOMAIN)
    schedule_timeout_seconds: int = Field(default=60, ge=1, le=86400)


class Scheduling(_Model):
    """How the job's pods are scheduled."""

    gang: Gang | None = None


RuntimeMode = Literal["Inject", "Image"]


class Runtime(_Model):
    """Where the worker runtime (ddp-worker, torchrun's agent, the recovery hooks) comes from (docs/worker.md)."""

    mode: RuntimeMode = Field(default="Inject", description=(
        "Inject: an init container copies the pure-Python runtime into the pod and the worker command runs under "
        "it with the image's own Python and torch (any image with torch works). Image: the image has ddpjob "
        "installed and ddp-worker as its entrypoint (the worker image, or pip install ddpjob[worker])."))
    image: str | None = Field(default=None, min_length=1, max_length=1024, description=(
        "The runtime image (init container and rendezvous pod); default: the operator's --runtime-image."))


CleanPodPolicy = Literal["None", "Running", "All"]


class RunPolicy(_Model):
    """How failures, time and suspension are handled."""

    backoff_limit: int = Field(default=6, ge=0, description="Incidents allowed before the job fails.")
    retryable_exit_codes: tuple[int, ...] | None = Field(
        default=None, description="Exit codes that replace the pod; default: 128+signal codes (>=128)."
    )
    permanent_exit_codes: tuple[int, ...] | None = Field(
        default=None, description="Exit codes that fail the job at once; default: 1-127."
    )
    active_deadline_seconds: int | None = Field(default=None, ge=1)
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0)
    clean_pod_policy: CleanPodPolicy = "Running"
    suspend: bool = False
    terminating_node_timeout_seconds: int = Field(
        default=300, ge=0, description="Force-delete a pod stuck Terminating on a NotReady node after this."
    )
    incident_window_seconds: int = Field(
        default=60, ge=0, description="Losses of distinct pods within this many seconds are one incident."
    )
    progress_deadline_seconds: int = Field(
        default=900, ge=0, description="Stalled after this long between two training steps (0: never Stalled)."
    )
    startup_deadline_seconds: int = Field(
        default=1800, ge=0, description="Stalled when a (re)started group did no step for this long (0: never)."
    )
    on_stall: Literal["RestartGroup", "Fail"] = Field(
        default="RestartGroup", description="What a stall of running workers does: restart them, or fail."
    )

    @model_validator(mode="after")
    def _codes(self) -> RunPolicy:
        both = set(self.retryable_exit_codes or ()) & set(self.permanent_exit_codes or ())
        if both:
            raise ValueError(f"exit codes {sorted(both)} are both retryable and permanent; list each once")
        for code in (*(self.retryable_exit_codes or ()), *(self.permanent_exit_codes or ())):
            if not 1 <= code <= 255:
                raise ValueError(f"exit code {code} is out of range: use 1..255 (0 is success)")
        return self


class DDPJobSpec(_Model):
    """What a user asks for."""

    replicas: int = Field(ge=1, description="Desired worker pods (the scale subresource writes this).")
    elastic: Elastic | None = None
    spares: int = Field(default=0, ge=0, le=16, description="Hot spare pods waiting at the rendezvous (fixed jobs).")
    nproc_per_node: str = Field(default="auto", description="auto | gpu | cpu | N (torchrun --nproc-per-node).")
    max_restarts: int = Field(default=3, ge=0, description="torchrun's in-pod restarts of the worker group.")
    template: dict[str, Any] = Field(description="Pod template for every worker (a PodTemplateSpec).")
    checkpoint: Checkpoint = Checkpoint()
    rendezvous: Rendezvous = Rendezvous()
    run_policy: RunPolicy = RunPolicy()
    scheduling: Scheduling = Scheduling()
    runtime: Runtime = Runtime()
    managed_by: str | None = Field(default=None, max_length=63, pattern=MANAGED_BY_PATTERN, description=(
        "The controller that runs the job: absent or ddpjob.io/operator, this operator; kueue.x-k8s.io/multikueue, "
        "MultiKueue (this operator makes the job's Workload only); any other value, that controller (this operator "
        "creates nothing for it and writes no status). Immutable."))
    network_policy: Literal["Required", "Disabled"] = Field(default="Required", description=(
        "Required: the job's NetworkPolicy is created before any pod, and no pod is created while it cannot be. "
        "Disabled: none is created (the namespace's own policies are all there is)."))

    @model_validator(mode="before")
    @classmethod
    def _nproc_as_string(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and isinstance(data.get("nprocPerNode"), int):
            return {**data, "nprocPerNode": str(data["nprocPerNode"])}
        return data

    @model_validator(mode="after")
    def _check(self) -> DDPJobSpec:
        nproc = self.nproc_per_node
        if nproc not in ("auto", "gpu", "cpu") and not (nproc.isdigit() and int(nproc) > 0):
            raise ValueError(f"nprocPerNode={nproc!r}: use auto, gpu, cpu or a positive integer")
        if self.elastic is not None:
            lo, hi = self.elastic.min_replicas, self.elastic.max_replicas
            if lo > hi:
                raise ValueError(f"elastic.minReplicas ({lo}) is greater than elastic.maxReplicas ({hi})")
            if not lo <= self.replicas <= hi:
                raise ValueError(f"replicas ({self.replicas}) must lie within elastic [{lo}, {hi}]")
            if self.spares:
                # An elastic rendezvous admits every waiting pod up to maxReplicas: a "spare" would join as a
                # worker and change the world size, which is what a spare must never do.
                raise ValueError(f"spares needs a fixed-size job (spares is {self.spares}): remove spec.elastic, "
                                 "or set spares to 0 (an elastic job already goes on with fewer workers)")
        containers = (self.template.get("spec") or {}).get("containers") or []
        if not containers:
            raise ValueError("template.spec.containers is empty: add a container named 'worker' that runs torchrun")
        if len(containers) > 1 and not any(c.get("name") == WORKER_CONTAINER for c in containers):
            raise ValueError(
                f"template.spec.containers has several containers; name the training one '{WORKER_CONTAINER}'"
            )
        if not any(c.get("image") for c in containers):
            raise ValueError("template.spec.containers[].image is empty: set the worker image")
        from ddpjob_operator.api.template_checks import check_template  # it reads DDPJobSpec: imported here

        check_template(self)
        return self

    @property
    def network_policy_required(self) -> bool:
        """Whether the job's pods wait for its NetworkPolicy (spec.networkPolicy: Required)."""
        return self.network_policy == "Required"

    @property
    def min_replicas(self) -> int:
        """Lower bound of the worker count (replicas when not elastic)."""
        return self.elastic.min_replicas if self.elastic else self.replicas

    @property
    def pod_count(self) -> int:
        """Worker pods the operator keeps: the workers plus the hot spares (indices 0..pod_count-1; torchrun's
        rendezvous, not the index, decides which of them train)."""
        return self.replicas + self.spares

    @property
    def max_replicas(self) -> int:
        """Upper bound of the worker count (replicas when not elastic)."""
        return self.elastic.max_replicas if self.elastic else self.replicas

    @property
    def steps_visible(self) -> bool:
        """Whether the worker runtime runs the training command in-process and so counts its steps (a Python
        script or module under ddp-worker; not a binary, a shell script, or a container that replaces ddp-worker)."""
        containers = (self.template.get("spec") or {}).get("containers") or []
        worker = containers[worker_container_index(containers)]
        command = self.worker_command(worker)
        return command is not None and python_target(command) is not None

    def worker_command(self, worker: Mapping[str, Any]) -> list[str] | None:
        """The training command the runtime runs for this worker container; None when the container replaces
        ddp-worker with a program of its own (``runtime.mode: Image`` only)."""
        if self.runtime.mode == "Inject":
            return injected_command(worker.get("command"), worker.get("args"))
        return training_command(worker.get("command"), worker.get("args"))


def worker_container_index(containers: list[dict[str, Any]]) -> int:
    """Index of the training container: the one named 'worker', else the only one (the model guarantees it)."""
    for i, c in enumerate(containers):
        if c.get("name") == WORKER_CONTAINER:
            return i
    return 0


class DDPJob(_Model):
    """A parsed DDPJob: identity plus spec (status is not modelled here; it is computed, never parsed)."""

    name: str
    namespace: str
    uid: str
    generation: int = 0
    labels: dict[str, str] = Field(default_factory=dict)
    """metadata.labels: Kueue's queue-name and priority-class labels are read from here."""
    spec: DDPJobSpec


def _field_path(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts[-1 if parts else 0 :] = [f"{parts[-1] if parts else ''}[{item}]"]
        else:
            parts.append(to_camel(item) if "_" in item else item)
    return ".".join(parts)


#: Valid specs kept by their JSON text (parse_spec), the least recently used going first.
PARSED_SPECS = 1024
_parsed: OrderedDict[str, DDPJobSpec] = OrderedDict()


def parse_spec(spec: Mapping[str, Any], *, prefix: str = "spec") -> DDPJobSpec:
    """Validate a DDPJob ``spec``; raise InvalidSpec naming the first bad field and how to fix it. A spec parsed
    before is not validated again (the models are frozen): every pass parses its job's spec, several times when it
    plans again with the API server's answers, and validating was 4 % of the operator's CPU while 500 jobs started
    (issue 46); its JSON text is a fifth of that."""
    try:
        text = json.dumps(spec, sort_keys=True)
    except (TypeError, ValueError):  # not JSON (a manifest's YAML may hold dates): validated, not kept
        return _validate(spec, prefix)
    parsed = _parsed.get(text)
    if parsed is None:  # from the text: the kept model owns its template, whatever the caller's dict does later
        parsed = _parsed[text] = _validate(json.loads(text), prefix)
        if len(_parsed) > PARSED_SPECS:
            _parsed.popitem(last=False)
    else:
        _parsed.move_to_end(text)
    return parsed


def _validate(spec: Mapping[str, Any], prefix: str) -> DDPJobSpec:
    try:
        return DDPJobSpec.model_validate(dict(spec))
    except ValidationError as err:
        first = err.errors()[0]
        loc = tuple(x for x in first["loc"] if x not in ("function-after[_check(), DDPJobSpec]",))
        path = _field_path(loc)
        msg = first["msg"].removeprefix("Value error, ")
        field = f"{prefix}.{path}" if path else prefix
        named = _NAMED_RE.match(msg) if first["type"] == "value_error" else None
        if named:  # a validator that names the exact field inside its model: "template.spec...env[0].name: ..."
            field, msg = f"{field}.{named[1]}", named[2]
        if first["type"] == "string_pattern_mismatch":
            msg = _PATTERN_WORDS.get(str((first.get("ctx") or {}).get("pattern")), msg)
        if first["type"] == "extra_forbidden":
            msg = "unknown field; check its spelling against docs/api.md"
        elif first["type"] == "missing":
            msg = "is required"
        raise InvalidSpec(field, msg) from None


def parse_ddpjob(obj: Mapping[str, Any]) -> DDPJob:
    """Parse a whole DDPJob object (from the API server or a manifest file)."""
    if obj.get("kind") not in (None, KIND):
        raise InvalidSpec("kind", f"is {obj.get('kind')!r}, expected {KIND}")
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    if not name:
        raise InvalidSpec("metadata.name", "is required")
    if len(name) > MAX_NAME_LENGTH or not _NAME_RE.match(name):
        raise InvalidSpec(
            "metadata.name",
            f"{name!r} must be a lowercase DNS label (a-z, 0-9, '-', starting with a letter) of at most "
            f"{MAX_NAME_LENGTH} characters: worker pods are named <name>-worker-<index>",
        )
    spec = parse_spec(obj.get("spec") or {})
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    if spec.managed_by == MULTIKUEUE_MANAGER and not labels.get(QUEUE_LABEL):
        raise InvalidSpec("spec.managedBy", f"{MULTIKUEUE_MANAGER} dispatches the job through a Kueue queue: add the "
                          f"label {QUEUE_LABEL} naming a LocalQueue whose ClusterQueue has the MultiKueue admission "
                          "check, or remove spec.managedBy to run the job in this cluster")
    ckpt = spec.checkpoint
    if labels.get(QUEUE_LABEL) and not ckpt.has_claim and ckpt.object_store is None:
        raise InvalidSpec("spec.checkpoint", f"a job in a Kueue queue (label {QUEUE_LABEL}) can be preempted, and "
                          "a preemption deletes all its pods with the checkpoints on their emptyDir volumes: it "
                          "would train again from step 0. Set spec.checkpoint.objectStore (checkpoints uploaded and "
                          "restored), volumeClaim (the operator creates a PVC) or existingClaim, so a preempted job "
                          "resumes from its last checkpoint")
    return DDPJob(
        name=name,
        namespace=meta.get("namespace") or "default",
        uid=meta.get("uid") or "",
        generation=int(meta.get("generation") or 0),
        labels=labels,
        spec=spec,
    )

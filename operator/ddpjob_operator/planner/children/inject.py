"""The injected worker runtime (docs/worker.md): what turns a user's own image, with Python and torch but nothing of
ours, into a ddpjob worker. An init container from the small runtime image copies the pure-Python runtime into an
emptyDir; the worker container's command becomes ``<the image's python> /ddpjob/bin/ddp-worker -- <command>``.
Pure, like the builders that call it."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from ddpjob_worker.contract import (
    DDPJOB_IMAGE,
    RUNTIME_IMAGE_DIR,
    RUNTIME_INIT_CONTAINER,
    RUNTIME_MOUNT_PATH,
    RUNTIME_VOLUME,
    runs_python,
)

from ddpjob_operator.api.spec import DDPJob

Obj = dict[str, Any]

#: What `make images` builds; the chart sets the operator's --runtime-image (env DDPJOB_RUNTIME_IMAGE) to its own.
DEFAULT_RUNTIME_IMAGE = "ddpjob-runtime:dev"
#: cp of ~6 MB of Python files (the runtime and its vendored boto3): the smallest requests the schedulers honour, a
#: limit for a quota that needs one.
INIT_RESOURCES = {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}}



def with_operator_image(job: DDPJob, image: str) -> DDPJob:
    """The job as the builders see it: its own spec.runtime.image, else the operator's ``--runtime-image`` (data
    the controller passes in, not a process global, so a pass depends only on what it is given)."""
    if job.spec.runtime.image or not image:
        return job
    runtime = job.spec.runtime.model_copy(update={"image": image})
    return job.model_copy(update={"spec": job.spec.model_copy(update={"runtime": runtime})})


def runtime_image(job: DDPJob) -> str:
    """The job's runtime image: spec.runtime.image (with_operator_image fills it in), else what `make images`
    builds."""
    return job.spec.runtime.image or DEFAULT_RUNTIME_IMAGE


def bootstrap_python(command: Sequence[str]) -> str:
    """The interpreter that runs the runtime: the one the training command names (``python``, ``/opt/conda/bin/
    python3``: the one that has torch), else ``python3`` from the image's PATH."""
    if runs_python(command):
        return command[0]
    return "python3"


def init_container(image: str, security: Obj) -> Obj:
    """The init container that copies the runtime into the pod (a plain cp: the runtime image has coreutils)."""
    return {
        "name": RUNTIME_INIT_CONTAINER,
        "image": image,
        # Set, not defaulted: :latest (or no tag) would default to Always, which fails wherever images are imported
        # rather than pulled (kind, air-gapped nodes); released tags are immutable, so IfNotPresent suits them.
        "imagePullPolicy": "IfNotPresent",
        "command": ["cp", "-R", f"{RUNTIME_IMAGE_DIR}/.", RUNTIME_MOUNT_PATH],
        "volumeMounts": [{"name": RUNTIME_VOLUME, "mountPath": RUNTIME_MOUNT_PATH}],
        "resources": copy.deepcopy(INIT_RESOURCES),
        "securityContext": copy.deepcopy(security),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def inject_runtime(job: DDPJob, pod_spec: Obj, worker: Obj, security: Obj) -> None:
    """Rewrite a worker pod spec (in place) to run its training command under the injected runtime."""
    command = job.spec.worker_command(worker) or []  # never empty: template_checks refuses that
    worker["command"] = [bootstrap_python(command), f"{RUNTIME_MOUNT_PATH}/bin/ddp-worker", "--", *command]
    worker.pop("args", None)
    worker["env"] = [*(worker.get("env") or []), {"name": DDPJOB_IMAGE, "value": str(worker.get("image") or "")}]
    worker["volumeMounts"] = [*(worker.get("volumeMounts") or []),
                              {"name": RUNTIME_VOLUME, "mountPath": RUNTIME_MOUNT_PATH, "readOnly": True}]
    volume = {"name": RUNTIME_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}}
    pod_spec["volumes"] = [*(pod_spec.get("volumes") or []), volume]
    # First, so that a user's own init containers could already use the runtime.
    init = init_container(runtime_image(job), security)
    pod_spec["initContainers"] = [init, *(pod_spec.get("initContainers") or [])]

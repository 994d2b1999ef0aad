"""The injected runtime (inject.py): how a user's container is rewritten, and what stays as it was."""

from __future__ import annotations

from typing import Any

import pytest
from ddpjob_operator.api.spec import InvalidSpec, parse_ddpjob
from ddpjob_operator.planner.children import builders, inject
from ddpjob_operator.planner.plan import Observed, plan

from tests.unit.operator.factories import at, make_job

pytestmark = pytest.mark.unit
Obj = dict[str, Any]


def worker_pod(container: Obj, **spec: Any) -> Obj:
    body = make_job().with_spec(**spec).obj() if spec else make_job().obj()
    body["spec"]["template"]["spec"]["containers"] = [{"name": "worker", **container}]
    return builders.build_worker_pod(parse_ddpjob(body), 0)


@pytest.mark.parametrize(("container", "command"), [
    pytest.param({"image": "ddpjob-worker:dev", "args": ["python", "-m", "pkg.train", "--lr", "1"]},
                 ["python", "/ddpjob/bin/ddp-worker", "--", "python", "-m", "pkg.train", "--lr", "1"],
                 id="worker-image-args-only"),
    pytest.param({"image": "my:1", "command": ["python3", "train.py"], "args": ["--epochs", "2"]},
                 ["python3", "/ddpjob/bin/ddp-worker", "--", "python3", "train.py", "--epochs", "2"],
                 id="command-plus-args"),
    pytest.param({"image": "conda:1", "command": ["/opt/conda/bin/python", "/app/t.py"]},
                 ["/opt/conda/bin/python", "/ddpjob/bin/ddp-worker", "--", "/opt/conda/bin/python", "/app/t.py"],
                 id="the-commands-own-python-runs-the-runtime"),
    pytest.param({"image": "my:1", "command": ["ddp-worker", "--", "python", "t.py"]},
                 ["python", "/ddpjob/bin/ddp-worker", "--", "python", "t.py"], id="ddp-worker-command-unwrapped"),
    pytest.param({"image": "my:1", "command": ["/app/run.sh"], "args": ["x"]},
                 ["python3", "/ddpjob/bin/ddp-worker", "--", "/app/run.sh", "x"], id="non-python-under-python3"),
])
def test_worker_command_is_wrapped(container: Obj, command: list[str]) -> None:
    worker = worker_pod(container)["spec"]["containers"][0]
    assert worker["command"] == command
    assert "args" not in worker


def test_init_container_volume_mount_and_image_env() -> None:
    pod = worker_pod({"image": "my:1", "command": ["python", "t.py"]})
    spec = pod["spec"]
    init = spec["initContainers"][0]
    assert init["name"] == "ddpjob-runtime" and init["image"] == inject.DEFAULT_RUNTIME_IMAGE
    assert init["command"] == ["cp", "-R", "/opt/ddpjob-runtime/.", "/ddpjob"]
    assert init["securityContext"]["runAsNonRoot"] is True
    assert {"name": "ddpjob-runtime", "emptyDir": {"sizeLimit": "64Mi"}} in spec["volumes"]
    worker = spec["containers"][0]
    assert {"name": "ddpjob-runtime", "mountPath": "/ddpjob", "readOnly": True} in worker["volumeMounts"]
    assert {"name": "DDPJOB_IMAGE", "value": "my:1"} in worker["env"]


def test_users_init_containers_run_after_ours() -> None:
    body = make_job().obj()
    body["spec"]["template"]["spec"]["initContainers"] = [{"name": "fetch-data", "image": "busybox"}]
    spec = builders.build_worker_pod(parse_ddpjob(body), 0)["spec"]
    assert [c["name"] for c in spec["initContainers"]] == ["ddpjob-runtime", "fetch-data"]


def test_image_mode_keeps_the_container_as_written() -> None:
    pod = worker_pod({"image": "ddpjob-worker:dev", "args": ["python", "t.py"]}, runtime={"mode": "Image"})
    worker = pod["spec"]["containers"][0]
    assert worker["args"] == ["python", "t.py"] and "command" not in worker
    assert "initContainers" not in pod["spec"]
    assert all(v["name"] != "ddpjob-runtime" for v in pod["spec"]["volumes"])


def images(p: Any) -> set[str]:
    """Every runtime image in a plan's pods: the init containers' and the rendezvous pod's."""
    found = set()
    for pod in p.create_pods:
        spec = pod["spec"]
        found |= {c["image"] for c in spec.get("initContainers") or []}
        if pod["metadata"]["labels"].get("ddpjob.io/replica-type") == "rendezvous":
            found |= {c["image"] for c in spec["containers"]}
    return found


def test_runtime_image_precedence() -> None:
    """The job's own spec.runtime.image, else the operator's --runtime-image (data in the observation, never a
    process global: a pass depends only on what it is given), else what `make images` builds."""
    body = make_job().obj()
    assert images(plan(body, Observed(), at(0))) == {"ddpjob-runtime:dev"}
    assert images(plan(body, Observed(runtime_image="flag/rt:3"), at(0))) == {"flag/rt:3"}
    own = make_job().with_spec(runtime={"image": "own/rt:4"}).obj()
    assert images(plan(own, Observed(runtime_image="flag/rt:3"), at(0))) == {"own/rt:4"}
    assert inject.runtime_image(parse_ddpjob(body)) == "ddpjob-runtime:dev"


@pytest.mark.parametrize(("container", "words"), [
    pytest.param({"image": "my:1"}, "spec.template.spec.containers[0].command: no training command",
                 id="no-command"),
    pytest.param({"image": "my:1", "command": ["python", "t.py"],
                  "volumeMounts": [{"name": "d", "mountPath": "/ddpjob"}]},
                 "volumeMounts[0].mountPath: /ddpjob is where the operator mounts the injected runtime",
                 id="mount-taken"),
])
def test_injection_refuses_what_it_cannot_run(container: Obj, words: str) -> None:
    body = make_job().obj()
    body["spec"]["template"]["spec"]["containers"] = [{"name": "worker", **container}]
    with pytest.raises(InvalidSpec) as err:
        parse_ddpjob(body)
    assert words in str(err.value)


def test_image_mode_needs_no_command() -> None:
    body = make_job().with_spec(runtime={"mode": "Image"}).obj()
    body["spec"]["template"]["spec"]["containers"] = [{"name": "worker", "image": "ddpjob-worker:dev"}]
    assert parse_ddpjob(body).spec.runtime.mode == "Image"


def test_ddpjob_run_wraps_the_command_like_a_pod(tmp_path: Any) -> None:
    import sys

    from ddpjob_operator.cli.local_run import agent_argv

    entry = [sys.executable, "-m", "ddpjob_worker.entrypoint", "--"]
    assert agent_argv({"command": ["python3", "t.py"], "args": ["-x"]}, tmp_path, inject=True) == [
        *entry, sys.executable, "t.py", "-x"]
    assert agent_argv({"args": ["python", "-m", "m"]}, tmp_path, inject=True) == [*entry, sys.executable, "-m", "m"]
    assert agent_argv({"command": ["python", "t.py"]}, tmp_path) == [sys.executable, "t.py"]  # mode Image

"""The images built by hack/images.sh, run with Docker: the worker trains, the operator answers its liveness
probe against a real API server. Slow (torch in a container), so marked e2e: `make e2e` (and so `make test`)
runs them, `make test-fast` does not. Alone:

    make images && .venv/bin/python -m pytest tests/images -m e2e
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Cluster, wait_for

pytestmark = pytest.mark.e2e

TAG = os.environ.get("TAG", "dev")
WORKER = f"ddpjob-worker:{TAG}"
OPERATOR = f"ddpjob-operator:{TAG}"
REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "charts" / "ddpjob-operator" / "files" / "ddpjob-crd.yaml"
# Debian's client where hack/images.sh installed it (it matches the daemon it started).
DOCKER = os.environ.get("DOCKER") or ("/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker")


def docker(*args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def skip_unless_built(images: tuple[str, ...], build: str) -> None:
    """Skip the module unless Docker answers and ``images`` exist: these tests check what ``build`` built."""
    if shutil.which(DOCKER) is None or docker("info", check=False).returncode != 0:
        pytest.skip("no Docker daemon: run `make images` first (it installs and starts one)")
    missing = [i for i in images if docker("image", "inspect", i, check=False).returncode != 0]
    if missing:
        pytest.skip(f"images {missing} not built: run `{build}`")


@pytest.fixture(scope="module", autouse=True)
def images() -> None:
    """Both images must exist: these tests check what `make images` built, they do not build."""
    skip_unless_built((WORKER, OPERATOR), "make images")


def test_the_offline_base_never_takes_the_official_name() -> None:
    """Issue 44 #1: where python:3.11-slim-bookworm cannot be pulled, hack/images.sh builds a stand-in under a name
    of its own; an image under the official name is the official one (a user's Docker keeps its meaning)."""
    note = docker("image", "inspect", "-f", "{{.Comment}}", "python:3.11-slim-bookworm", check=False)
    assert note.returncode != 0 or "local stand-in" not in note.stdout, note.stdout
    base = docker("image", "inspect", "-f", "{{.Id}}", "ddpjob-local/python:3.11-slim-bookworm", check=False)
    official = docker("image", "inspect", "-f", "{{.Id}}", "python:3.11-slim-bookworm", check=False)
    assert base.returncode == 0 or official.returncode == 0, "neither the official base nor the stand-in is there"


@pytest.mark.parametrize("image", [WORKER, OPERATOR])
def test_image_runs_as_non_root_without_build_tools(image: str) -> None:
    config = json.loads(docker("image", "inspect", image).stdout)[0]["Config"]
    assert config["User"] == "10001:10001"
    out = docker("run", "--rm", "--entrypoint", "sh", image, "-c", "id -u; command -v gcc cc make pip || true").stdout
    assert out.splitlines() == ["10001"], f"root user or build tools in the image:\n{out}"
    proc = docker("run", "--rm", "--entrypoint", "python", image, "-m", "pip", "--version", check=False)
    assert "No module named pip" in proc.stderr, proc.stdout + proc.stderr


@pytest.mark.parametrize("image", [WORKER, OPERATOR])
def test_image_holds_no_build_inputs(image: str) -> None:
    """The wheelhouse, requirement lists and install script are bind-mounted during the build, never copied: no
    wheel (a second copy of torch) and nothing but empty mount points may be left of them. The base image's
    /usr/share/python-wheels (pip and setuptools for `python3 -m venv`, Debian's python3-venv) is not ours."""
    script = ("find / -xdev -path /usr/share/python-wheels -prune -o \\( -name '*.whl' -o -name 'requirements*.txt' "
              "-o -name image-venv.sh \\) ! -empty -print 2>/dev/null; "
              "ls -d /wheelhouse /requirements /src 2>/dev/null; true")
    out = docker("run", "--rm", "--entrypoint", "sh", image, "-c", script).stdout
    assert out == "", f"build inputs left in {image}:\n{out}"


@pytest.mark.parametrize("module", ["torch", "kubernetes"])
def test_operator_image_has_no_worker_dependencies(module: str) -> None:
    """torch (GBs) and the kubernetes client (~126 MB, only the worker's progress reporter uses it) stay out."""
    proc = docker("run", "--rm", "--entrypoint", "python", OPERATOR, "-c", f"import {module}", check=False)
    assert proc.returncode != 0 and f"No module named '{module}'" in proc.stderr


def test_worker_help() -> None:
    out = docker("run", "--rm", "--network=none", WORKER, "--help").stdout
    assert out.startswith("usage: ddp-worker"), out


def test_worker_trains_the_example_under_the_env_contract() -> None:
    """What a worker pod does, in one container: the rendezvous store (`python -m ddpjob_worker.rdzv`, as the
    operator's rdzv pod runs it) in the background, then `ddp-worker` -> torchrun with 2 CPU processes.
    Docker's default network, not --network=none: torchrun's agent advertises its host name, which resolves in a
    pod (and on a Docker network) but not in a container without one."""
    from ddpjob_worker.contract import WorkerEnv

    env = WorkerEnv(job_name="img", namespace="test", job_uid=str(uuid.uuid4()), worker_index=0, min_nodes=1,
                    max_nodes=1, nproc_per_node="2", rdzv_endpoint="127.0.0.1:29400", max_restarts=0,
                    checkpoint_dir="/tmp/checkpoints").to_env()
    env_args = [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
    script = ("python -m ddpjob_worker.rdzv --port 29400 & "
              "exec ddp-worker python -m ddpjob_worker.examples.charlm --epochs 1 --steps-per-epoch 6 "
              "--batch-size 8 --seq-len 32 --d-model 32 --layers 1 --heads 2 --checkpoint-every 3 --log-every 2")
    t0 = time.monotonic()
    proc = docker("run", "--rm", "--read-only", "--tmpfs=/tmp", "--tmpfs=/home/ddpjob",
                  "--cap-drop=ALL", "--security-opt=no-new-privileges", *env_args,
                  "--entrypoint", "sh", WORKER, "-c", script, timeout=400, check=False)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"exit {proc.returncode} after {time.monotonic() - t0:.0f}s:\n{log[-4000:]}"
    assert "step" in log.lower(), log[-4000:]


@pytest.fixture
def flat_kubeconfig(cluster: Cluster, tmp_path: Path) -> Path:
    """The cluster's kubeconfig with certificates inline and world-readable: the container user (10001)
    cannot read the host's 0600 key files."""
    out = cluster.kubectl("config", "view", "--flatten", "--minify").stdout
    path = tmp_path / "kubeconfig"
    path.write_text(out)
    path.chmod(0o644)
    tmp_path.chmod(0o755)
    return path


@pytest.fixture
def operator_container(cluster: Cluster, namespace: str, flat_kubeconfig: Path) -> Iterator[tuple[str, int]]:
    """The operator image started as the chart starts it (read-only root, /tmp tmpfs, no capabilities), on the
    host network so it reaches the loopback API server. Yields (container id, liveness port)."""
    from tests.cluster.controlplane import free_port

    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    liveness, metrics = free_port(), free_port()
    cid = docker(
        "run", "-d", "--network=host", "--read-only", "--tmpfs=/tmp", "--cap-drop=ALL",
        "--security-opt=no-new-privileges", "-e", "HOME=/tmp", "-e", "KUBECONFIG=/etc/ddpjob/kubeconfig",
        "-v", f"{flat_kubeconfig}:/etc/ddpjob/kubeconfig:ro", OPERATOR,
        "operator", f"--metrics-port={metrics}", f"--liveness-port={liveness}", f"--namespace={namespace}",
    ).stdout.strip()
    try:
        yield cid, liveness
    finally:
        logs = docker("logs", "--tail", "60", cid, check=False)
        print(f"--- operator container log (tail) ---\n{logs.stdout}{logs.stderr}")
        docker("rm", "-f", cid, check=False)


def test_operator_image_answers_liveness_and_reconciles(
    cluster: Cluster, namespace: str, operator_container: tuple[str, int]
) -> None:
    cid, port = operator_container

    def healthy() -> bool:
        running = docker("inspect", "-f", "{{.State.Running}}", cid).stdout.strip() == "true"
        assert running, "operator container exited:\n" + docker("logs", "--tail", "40", cid).stderr
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=3) as resp:
            return bool(resp.status == 200)

    wait_for(healthy, timeout=90, describe=f"operator image answering http://127.0.0.1:{port}/healthz")

    # Beyond liveness: the operator in the image really talks to the API server and creates a job's children.
    cluster.kubectl("apply", "-n", namespace, "-f", str(REPO / "manifests" / "examples" / "cpu-charlm.yaml"))
    wait_for(lambda: cluster.kubectl("get", "pods", "-n", namespace, "-l", "ddpjob.io/job-name", "-o", "name").stdout,
             timeout=90, describe="pods created by the operator image",
             state=lambda: docker("logs", "--tail", "30", cid).stderr)

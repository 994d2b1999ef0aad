"""The injected runtime's image and the e2e tier's plain user image, run with Docker: the runtime image holds the
pure-Python runtime and nothing else of ours, the plain image holds torch and a script and nothing of ddpjob, and the
runtime copied out of one runs in the other on the user's Python and torch alone (what the operator's init container
and the worker container do in a pod). Alone:

    bash hack/images.sh --e2e && .venv/bin/python -m pytest tests/images/test_runtime_images.py -m e2e
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.training import PLAIN_IMAGE, RUNTIME_IMAGE, oldest_torch
from tests.images.test_images import REPO, docker, skip_unless_built

pytestmark = pytest.mark.e2e

RUNTIME_DIR = "/opt/ddpjob-runtime"


@pytest.fixture(scope="module", autouse=True)
def images() -> None:
    """These tests check what `hack/images.sh --e2e` built, they do not build."""
    skip_unless_built((RUNTIME_IMAGE, PLAIN_IMAGE), "bash hack/images.sh --e2e")


@pytest.fixture(scope="module")
def runtime_volume() -> Iterator[str]:
    """A volume with the runtime copied out of its image, as the operator's init container does into an emptyDir."""
    name = f"ddpjob-runtime-test-{uuid.uuid4().hex[:8]}"
    docker("volume", "create", name)
    try:
        # As root: a fresh Docker volume is root's (in a pod the emptyDir is writable by the pod's fsGroup).
        docker("run", "--rm", "--user", "0", "-v", f"{name}:/ddpjob", RUNTIME_IMAGE, "cp", "-R", f"{RUNTIME_DIR}/.",
               "/ddpjob")
        yield name
    finally:
        docker("volume", "rm", "-f", name, check=False)


def test_the_runtime_image_holds_the_runtime_source_and_runs_as_non_root() -> None:
    config = json.loads(docker("image", "inspect", RUNTIME_IMAGE).stdout)[0]["Config"]
    assert config["User"] == "10001:10001"
    listing = docker("run", "--rm", RUNTIME_IMAGE, "sh", "-c", f"cd {RUNTIME_DIR} && find . -type f | sort").stdout
    files = set(listing.split())
    ours = {f"./lib/ddpjob_worker/{p.relative_to(REPO / 'worker' / 'ddpjob_worker')}"
            for p in (REPO / "worker" / "ddpjob_worker").rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert {"./bin/ddp-worker", "./bin/ddpjob-rdzv"} <= files
    assert ours <= files
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]  # the user's Python may differ
    # No venv and no installed dependencies: the runtime runs on the user's Python (or this image's python3).
    assert docker("run", "--rm", RUNTIME_IMAGE, "sh", "-c", "test -e /opt/venv", check=False).returncode != 0


def test_the_plain_image_has_torch_and_the_script_and_nothing_of_ddpjob() -> None:
    config = json.loads(docker("image", "inspect", PLAIN_IMAGE).stdout)[0]["Config"]
    assert config["User"].split(":")[0].isdigit() and config["User"].split(":")[0] != "0"
    assert not config.get("Entrypoint")
    probe = ("import importlib.util, torch; print(torch.__version__.split('+')[0]); "
             "print([m for m in ('ddpjob_worker', 'ddpjob_operator', 'kubernetes') if importlib.util.find_spec(m)])")
    out = docker("run", "--rm", PLAIN_IMAGE, "python3", "-W", "ignore", "-c", probe).stdout.split("\n")
    assert out[:2] == [oldest_torch(), "[]"]
    script = docker("run", "--rm", PLAIN_IMAGE, "cat", "/app/train.py").stdout
    assert script == (REPO / "tests" / "e2e" / "images" / "plain" / "train.py").read_text()


def test_the_injected_runtime_runs_on_the_plain_images_python_and_torch(runtime_volume: str) -> None:
    """Every runtime module imports under the oldest supported torch, read-only, and ddp-worker answers."""
    modules = [p.stem for p in (REPO / "worker" / "ddpjob_worker").glob("*.py") if p.stem != "__init__"]
    runtime_path = [m for m in modules if m not in ("checkpoint", "staging", "storage", "fencing", "replicas",
                                                    "sampler", "rngstate")]  # the checkpoint library needs numpy
    probe = ("import importlib, sys; sys.path.insert(0, '/ddpjob/lib'); "
             f"[importlib.import_module('ddpjob_worker.' + m) for m in {runtime_path!r}]; print('imported')")
    run = ["run", "--rm", "--read-only", "--cap-drop=ALL", "--security-opt=no-new-privileges",
           "-v", f"{runtime_volume}:/ddpjob:ro", PLAIN_IMAGE]
    assert docker(*run, "python3", "-W", "ignore", "-c", probe).stdout.strip() == "imported"
    assert "usage: ddp-worker" in docker(*run, "python3", "/ddpjob/bin/ddp-worker", "--help").stdout


def test_the_rendezvous_launcher_is_where_the_operator_runs_it() -> None:
    assert Path(REPO / "worker" / "bin" / "ddpjob-rdzv").exists()
    proc = docker("run", "--rm", RUNTIME_IMAGE, "python3", f"{RUNTIME_DIR}/bin/ddpjob-rdzv", "--help", check=False)
    assert proc.returncode == 0 and "--port" in proc.stdout, proc.stdout + proc.stderr

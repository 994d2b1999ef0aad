"""The injected runtime (docs/worker.md) with real torchrun agents: the runtime tree laid out as the runtime image's
init container leaves it in a pod (``lib/ddpjob_worker``, ``bin/ddp-worker``), run with a Python that has torch
but no ddpjob, around a tutorial-style script that imports nothing of ours."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import ddpjob_worker
import ddpjob_worker.examples.tutorial_ddp as tutorial
import pytest
import torch

from tests.worker.helpers import LocalJob, read_json, wait_exit

pytestmark = pytest.mark.torchrun
REPO = Path(__file__).resolve().parents[2]


def python_without_ddpjob() -> str:
    """A Python with torch where ddpjob is not installed: the shared dependency venv behind .venv (hack/venv.sh),
    or this interpreter when it is one (the torch matrix's venvs)."""
    for entry in sys.path:
        candidate = Path(entry).parents[2] / "bin" / "python" if "site-packages" in entry else None
        if candidate and candidate.exists() and candidate.parents[1] != Path(sys.prefix):
            probe = subprocess.run([str(candidate), "-c", "import torch, importlib.util as u; "
                                    "raise SystemExit(u.find_spec('ddpjob_worker') is not None)"], check=False)
            if probe.returncode == 0:
                return str(candidate)
    pytest.skip("no Python with torch but without ddpjob here")


def runtime_tree(dest: Path) -> Path:
    """What the runtime image holds under /opt/ddpjob-runtime (Dockerfile, target runtime)."""
    shutil.copytree(Path(ddpjob_worker.__file__).parent, dest / "lib" / "ddpjob_worker",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "worker" / "bin", dest / "bin")
    return dest


@pytest.mark.timeout(240)
def test_tutorial_script_runs_under_the_injected_runtime(job: LocalJob, tmp_path: Path) -> None:
    python = python_without_ddpjob()
    tree = runtime_tree(tmp_path / "ddpjob")
    script = tmp_path / "train.py"
    shutil.copy(tutorial.__file__, script)
    argv = [python, str(tree / "bin" / "ddp-worker"), "--", "python", str(script), "2", "1", "--batch_size", "64"]
    agents = [job._popen(argv, job.env(i, DDPJOB_IMAGE="plain:test"), job.log(i)) for i in range(2)]
    for a in agents:
        assert wait_exit(a, 200, job) == 0, job.tails()
    assert torch.load(job.workdir / "snapshot.pt", weights_only=True)["EPOCHS_RUN"] == 1
    progress = read_json(job.progress)  # counted by the injected runtime's recorded runner
    assert progress["source"] == "OptimizerSteps" and progress["globalStep"] == 32, progress


def test_an_image_without_torch_fails_at_once_naming_the_image(tmp_path: Path) -> None:
    """/usr/bin/python3 of this machine has no torch, as a plain python image would not."""
    bare = shutil.which("python3", path="/usr/bin")
    if bare is None or subprocess.run([bare, "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip("no Python without torch here")
    tree = runtime_tree(tmp_path / "ddpjob")
    log = tmp_path / "termination-log"
    done = subprocess.run([bare, str(tree / "bin" / "ddp-worker"), "--", "python3", "train.py"], capture_output=True,
                          text=True, timeout=30, env={"PATH": "/usr/bin:/bin", "DDPJOB_IMAGE": "python:3.11-slim",
                                                      "DDPJOB_TERMINATION_LOG": str(log)})
    assert done.returncode == 79, done.stderr
    message = log.read_text()
    assert message.startswith("image python:3.11-slim: /usr/bin/python3") and "cannot import torch" in message

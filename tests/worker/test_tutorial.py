"""A script written the way the PyTorch DDP tutorial writes them runs unmodified under ``ddp-worker`` (what a
pod runs) and under ``ddpjob run`` (the local runner)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ddpjob_worker.examples.tutorial_ddp as tutorial
import pytest
import torch
import yaml

from tests.worker.helpers import TINY, LocalJob, read_json, wait_exit

pytestmark = pytest.mark.torchrun
SCRIPT = str(Path(tutorial.__file__))


@pytest.mark.timeout(180)
def test_tutorial_script_runs_unmodified_under_ddp_worker(job: LocalJob) -> None:
    agents = [job.agent(i, ["python", SCRIPT, "3", "1", "--batch_size", "64"]) for i in range(2)]
    for a in agents:
        assert wait_exit(a, 150, job) == 0, job.tails()
    snapshot = torch.load(job.workdir / "snapshot.pt", weights_only=True)
    assert snapshot["EPOCHS_RUN"] == 2
    logs = job.logs()
    assert "[GPU0] Epoch 2" in logs and "[GPU1] Epoch 2" in logs  # both ranks trained every epoch
    # Its progress without a line of ddpjob in it: rank 0's optimizer steps, counted by the recorded runner
    # (2048 samples / 2 ranks / batch 64 = 16 steps per epoch, 3 epochs), the last sent when the script returned.
    progress = read_json(job.progress)
    assert progress["source"] == "OptimizerSteps" and progress["globalStep"] == 48, progress
    assert "epoch" not in progress and progress["start"]["firstStepTime"] <= progress["lastStepTime"], progress


@pytest.mark.timeout(180)
def test_a_script_with_its_own_reporter_keeps_its_report(job: LocalJob) -> None:
    """charlm reports through ProgressReporter: its global step and epoch, never the runtime's count on top."""
    args = ["python", "-m", "ddpjob_worker.examples.charlm", *TINY, "--epochs", "1", "--steps-per-epoch", "6"]
    agents = [job.agent(i, args) for i in range(2)]
    for a in agents:
        assert wait_exit(a, 150, job) == 0, job.tails()
    progress = read_json(job.progress)
    assert progress["source"] == "Reporter" and progress["globalStep"] == 6 and progress["epoch"] == 1, progress


def manifest(tmp_path: Path, args: list[str], replicas: int = 2, **spec: object) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({
        "apiVersion": "ddpjob.io/v1alpha1", "kind": "DDPJob", "metadata": {"name": "tutorial"},
        "spec": {**spec, "replicas": replicas, "nprocPerNode": "1", "maxRestarts": 2,
                 "rendezvous": {"lastCallSeconds": 1},
                 "template": {"spec": {"containers": [{"name": "worker", "image": "ddpjob-worker:dev",
                                                        "args": args}]}}},
    }))
    return path


@pytest.mark.timeout(180)
def test_tutorial_script_runs_unmodified_under_ddpjob_run(tmp_path: Path) -> None:
    job = manifest(tmp_path, ["python", SCRIPT, "3", "1", "--batch_size", "64"])
    proc = subprocess.run([sys.executable, "-m", "ddpjob_operator.cli", "run", str(job), "--workdir",
                           str(tmp_path / "local")], cwd=tmp_path, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "job tutorial succeeded" in proc.stderr
    assert "image 'ddpjob-worker:dev' ignored" in proc.stderr
    assert torch.load(tmp_path / "snapshot.pt", weights_only=True)["EPOCHS_RUN"] == 2


@pytest.mark.timeout(180)
def test_ddpjob_run_reports_the_failing_exit_code(tmp_path: Path) -> None:
    script = tmp_path / "fail.py"
    script.write_text("import sys\nsys.exit(3)\n")
    job = manifest(tmp_path, ["python", str(script)], replicas=1)
    proc = subprocess.run([sys.executable, "-m", "ddpjob_operator.cli", "run", str(job), "--workdir",
                           str(tmp_path / "local")], cwd=tmp_path, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 3, proc.stdout + proc.stderr  # the worker's own code, not torchrun's 1
    assert "job tutorial failed: worker 0 failed permanently: exit code 3" in proc.stderr, proc.stderr


@pytest.mark.timeout(180)
def test_ddpjob_run_counts_incidents_against_backoff_limit_like_the_operator(tmp_path: Path) -> None:
    """`ddpjob run` judges an agent's exit with the operator's own policies: a SIGKILLed trainer (137) is
    retryable and one incident each time; with backoffLimit 1 the second one fails the job, listing both."""
    script = tmp_path / "killed.py"
    script.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    job = manifest(tmp_path, ["python", str(script)], replicas=1, maxRestarts=0, runPolicy={"backoffLimit": 1})
    proc = subprocess.run([sys.executable, "-m", "ddpjob_operator.cli", "run", str(job), "--workdir",
                           str(tmp_path / "local")], cwd=tmp_path, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 137, proc.stdout + proc.stderr
    assert "incident #1 (WorkerFailed), 1 of backoffLimit 1: replacing it" in proc.stderr, proc.stderr
    assert "2 incidents exceed spec.runPolicy.backoffLimit (1): #1 WorkerFailed" in proc.stderr, proc.stderr


@pytest.mark.timeout(240)
def test_ddpjob_run_kill_after_restarts_and_resumes(tmp_path: Path) -> None:
    args = ["python", "-m", "ddpjob_worker.examples.charlm", *TINY, "--epochs", "2", "--steps-per-epoch", "8",
            "--checkpoint-every", "2", "--step-delay", "1.0"]
    job = manifest(tmp_path, args)
    proc = subprocess.run([sys.executable, "-m", "ddpjob_operator.cli", "run", str(job), "--workdir",
                           str(tmp_path / "local"), "--kill-after", "6"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=230)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "--kill-after: SIGKILLed worker 1's training process" in proc.stderr
    logs = "".join(p.read_text() for p in (tmp_path / "local" / "logs").glob("worker-*.log"))
    assert logs.count("ddpjob.charlm: training: world 2") >= 4  # both ranks started twice: a group restart
    assert (tmp_path / "local" / "checkpoints" / "step-16" / "COMPLETE.json").is_file()

"""Exact resume with real torchrun agents (gloo, CPU): a killed worker or a lost agent costs only the steps
since the last checkpoint, and the result is bit-for-bit the uninterrupted one."""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
from ddpjob_worker import procs

from tests.worker.helpers import TINY, LocalJob, wait_exit, wait_until

pytestmark = pytest.mark.torchrun

CHARLM = ["python", "-m", "ddpjob_worker.examples.charlm", *TINY, "--epochs", "2", "--steps-per-epoch", "6",
          "--checkpoint-every", "2"]


def run_uninterrupted(job: LocalJob, final: str) -> dict[str, torch.Tensor]:
    agents = [job.agent(i, [*CHARLM, "--save-final", final]) for i in range(2)]
    for a in agents:
        assert wait_exit(a, 240, job) == 0, job.tails()
    params: dict[str, torch.Tensor] = torch.load(job.workdir / final, weights_only=True)
    return params


def assert_bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"parameters differ after resume: {different}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The parameters of an uninterrupted run (computed once for every test of the module)."""
    reference_job = LocalJob(tmp_path_factory.mktemp("reference"))
    try:
        return run_uninterrupted(reference_job, "final.pt")
    finally:
        reference_job.close()


def pod_dir(job: LocalJob, index: int) -> Path:
    """The checkpoint directory of worker pod ``index`` when pods have no shared volume (an emptyDir each)."""
    return job.workdir / f"pod-{index}-checkpoints"


def steps_in(directory: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in directory.glob("step-*") if (p / "COMPLETE.json").is_file())


@pytest.mark.timeout(420)
def test_kill9_worker_mid_epoch_resumes_bitwise_identical(job: LocalJob, reference: dict[str, torch.Tensor]) -> None:
    # step-delay only slows the loop so the kill lands mid-epoch; it changes no number.
    agents = [job.agent(i, [*CHARLM, "--step-delay", "0.4", "--save-final", "final.pt"]) for i in range(2)]
    job.progress_at_least(3, 120)  # epoch 0, after checkpoint step-2, before step 6 (the epoch's end)
    victim = job.training_pid(agents[1])  # looked up now: the process that is training at this moment
    os.kill(victim, signal.SIGKILL)
    for a in agents:
        assert wait_exit(a, 240, job) == 0, job.tails()
    logs = job.logs()
    assert "resumed from checkpoint step-" in logs and "of the epoch" in logs
    resumed = [line for line in logs.splitlines() if "resumed from checkpoint" in line]
    assert any("epoch 0" in line and "step 0 of" not in line for line in resumed), resumed  # mid-epoch
    starts = [line for line in job.log(1).read_text().splitlines() if "ddpjob.entrypoint: exec" in line]
    assert len(starts) == 1  # the same agent restarted its worker in place: no replacement was needed
    assert_bitwise_equal(reference, torch.load(job.workdir / "final.pt", weights_only=True))


@pytest.mark.timeout(300)
def test_lost_agent_is_replaced_and_training_finishes(job: LocalJob) -> None:
    command = [*CHARLM, "--step-delay", "0.4"]
    agents = [job.agent(i, command) for i in range(2)]
    job.training_pid(agents[0])
    lost_workers = [job.training_pid(agents[1])]
    job.progress_at_least(3, 120)
    # A lost pod: the agent and its worker die at once, without any chance to clean up.
    os.kill(agents[1].pid, signal.SIGKILL)
    for pid in lost_workers:
        os.kill(pid, signal.SIGKILL)
    replacement = job.agent(1, command)
    for a in (agents[0], replacement):
        assert wait_exit(a, 240, job) == 0, job.tails()
    logs = job.logs()
    assert "resumed from checkpoint step-" in logs
    assert (job.ckpt_dir / "step-12" / "COMPLETE.json").is_file()  # 2 epochs x 6 steps, nothing repeated


@pytest.mark.timeout(420)
def test_per_pod_volumes_kill9_worker_resumes_from_checkpoint_bitwise_identical(
        job: LocalJob, reference: dict[str, torch.Tensor]) -> None:
    """No shared volume (each agent its own directory, as an emptyDir per pod). Rank 0 used to write alone, so
    after a kill -9 rank 1 found no checkpoint in its directory (FileNotFoundError) and the job failed."""
    command = [*CHARLM, "--step-delay", "0.4", "--save-final", "final.pt"]
    agents = [job.agent(i, command, DDPJOB_CHECKPOINT_DIR=str(pod_dir(job, i))) for i in range(2)]
    job.progress_at_least(3, 120)  # after checkpoint step-2, before the epoch's end (step 6)
    os.kill(job.training_pid(agents[1]), signal.SIGKILL)
    for a in agents:
        assert wait_exit(a, 240, job) == 0, job.tails()
    resumed = [line for line in job.logs().splitlines() if "resumed from checkpoint step-" in line]
    assert resumed and all("(local copy)" in line for line in resumed), resumed  # both pods had their copy
    assert_bitwise_equal(reference, torch.load(job.workdir / "final.pt", weights_only=True))
    assert steps_in(pod_dir(job, 0))[-1] == steps_in(pod_dir(job, 1))[-1] == 12  # every pod writes every save


@pytest.mark.timeout(420)
def test_per_pod_volumes_replaced_pod_receives_the_state_from_its_peer(
        job: LocalJob, reference: dict[str, torch.Tensor]) -> None:
    """A lost pod with an emptyDir comes back with an empty directory: it must resume from the checkpoint its
    peer holds (not from step 0, which would diverge from the peer), and hold a copy again afterwards."""
    command = [*CHARLM, "--step-delay", "0.4", "--save-final", "final.pt"]
    agents = [job.agent(i, command, DDPJOB_CHECKPOINT_DIR=str(pod_dir(job, i))) for i in range(2)]
    job.training_pid(agents[0])
    lost_worker = job.training_pid(agents[1])
    job.progress_at_least(3, 120)
    os.kill(agents[1].pid, signal.SIGKILL)
    os.kill(lost_worker, signal.SIGKILL)
    shutil.rmtree(pod_dir(job, 1))  # the replacement pod gets a new, empty emptyDir
    replacement = job.agent(1, command, DDPJOB_CHECKPOINT_DIR=str(pod_dir(job, 1)))
    for a in (agents[0], replacement):
        assert wait_exit(a, 240, job) == 0, job.tails()
    received = re.findall(r"resumed from checkpoint step-(\d+) \(received from rank \d\)", job.logs())
    assert received and int(received[0]) >= 2, job.tails()  # the peer's checkpoint, not step 0
    assert_bitwise_equal(reference, torch.load(job.workdir / "final.pt", weights_only=True))
    assert steps_in(pod_dir(job, 1))[-1] == 12


@pytest.mark.timeout(420)
def test_hang_flag_hangs_every_rank_once_without_changing_the_math(
        job: LocalJob, reference: dict[str, torch.Tensor]) -> None:
    """charlm --hang-at-step (for hang-detection tests): both ranks stop at step 5 with no collective pending;
    after their trainers are killed the restarted run goes past step 5 and ends bit for bit as the reference."""
    marker = job.workdir / "hang-marker"
    command = [*CHARLM, "--hang-at-step", "5", "--hang-marker", str(marker), "--save-final", "final.pt"]
    agents = [job.agent(i, command) for i in range(2)]
    hung = "hanging at step 5 on purpose"
    wait_until(lambda: all(hung in job.log(i).read_text() for i in range(2)), 180, "both ranks to hang")
    assert marker.exists()
    trainers = [job.training_pid(a) for a in agents]
    time.sleep(3)
    assert "step 6/6" not in job.logs() and all(procs.alive(pid) for pid in trainers)  # still hanging
    for pid in trainers:
        os.kill(pid, signal.SIGKILL)
    for a in agents:
        assert wait_exit(a, 240, job) == 0, job.tails()
    assert "resumed from checkpoint step-4" in job.logs()
    assert_bitwise_equal(reference, torch.load(job.workdir / "final.pt", weights_only=True))

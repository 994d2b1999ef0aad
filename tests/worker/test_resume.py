"""Exact resume with real torchrun agents (gloo, CPU): a killed worker or a lost agent costs only the steps
since the last checkpoint, and the result is bit-for-bit the uninterrupted one."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from tests.worker.helpers import TINY, LocalJob, wait_exit

pytestmark = pytest.mark.torchrun

CHARLM = ["python", "-m", "ddpjob_worker.examples.charlm", *TINY, "--epochs", "2", "--steps-per-epoch", "6",
          "--checkpoint-every", "2"]


def run_uninterrupted(job: LocalJob, final: str) -> dict[str, torch.Tensor]:
    agents = [job.agent(i, [*CHARLM, "--save-final", final]) for i in range(2)]
    for a in agents:
        assert wait_exit(a, 240, job) == 0, job.logs()[-4000:]
    params: dict[str, torch.Tensor] = torch.load(job.workdir / final, weights_only=True)
    return params


def assert_bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"parameters differ after resume: {different}"


@pytest.mark.timeout(420)
def test_kill9_worker_mid_epoch_resumes_bitwise_identical(job: LocalJob,
                                                          tmp_path_factory: pytest.TempPathFactory) -> None:
    reference_job = LocalJob(tmp_path_factory.mktemp("reference"))
    try:
        reference = run_uninterrupted(reference_job, "final.pt")
    finally:
        reference_job.close()

    # step-delay only slows the loop so the kill lands mid-epoch; it changes no number.
    agents = [job.agent(i, [*CHARLM, "--step-delay", "0.4", "--save-final", "final.pt"]) for i in range(2)]
    job.progress_at_least(3, 120)  # epoch 0, after checkpoint step-2, before step 6 (the epoch's end)
    victim = job.training_pid(agents[1])  # looked up now: the process that is training at this moment
    os.kill(victim, signal.SIGKILL)
    for a in agents:
        assert wait_exit(a, 240, job) == 0, job.logs()[-4000:]
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
        assert wait_exit(a, 240, job) == 0, job.logs()[-4000:]
    logs = job.logs()
    assert "resumed from checkpoint step-" in logs
    assert (job.ckpt_dir / "step-12" / "COMPLETE.json").is_file()  # 2 epochs x 6 steps, nothing repeated

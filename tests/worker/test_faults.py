"""Failure paths with real torchrun agents: a crash in the middle of a save, SIGTERM (preemption), and a broken
environment contract."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ddpjob_worker import contract

from tests.worker.helpers import TINY, LocalJob, read_json, wait_exit, wait_until

pytestmark = pytest.mark.torchrun
SCRIPTS = Path(__file__).parent / "scripts"


@pytest.mark.timeout(240)
def test_kill9_during_save_falls_back_to_previous_checkpoint(job: LocalJob) -> None:
    agent = job.agent(0, ["python", str(SCRIPTS / "big_save.py")], nnodes="1", max_restarts=1)
    worker = job.training_pid(agent)
    wait_until(lambda: (job.ckpt_dir / "step-1" / "COMPLETE.json").is_file(), 120, "checkpoint step-1")
    # Poll fast for the temporary folder of step 2, then kill the writer inside its save.
    wait_until(lambda: list(job.ckpt_dir.glob(".tmp-step-2-*")), 60, "the save of step 2 to start", 0.002)
    os.kill(worker, signal.SIGKILL)
    assert not (job.ckpt_dir / "step-2").exists(), "the save finished before the kill; make BIG_FLOATS larger"
    assert wait_exit(agent, 180, job) == 0, job.tails()
    logs = job.logs()
    assert "RESUMED global_step=1 big=1.0" in logs
    assert "resumed from checkpoint step-1" in logs
    assert not list(job.ckpt_dir.glob(".tmp-*")), "leftovers of the crashed save were not cleaned"


@pytest.mark.timeout(240)
def test_sigterm_writes_checkpoint_and_exits_nonzero_within_budget(job: LocalJob) -> None:
    budget = 20
    command = ["python", "-m", "ddpjob_worker.examples.charlm", *TINY, "--epochs", "1", "--steps-per-epoch",
               "200", "--checkpoint-every", "0", "--step-delay", "0.3"]
    agents = [job.agent(i, command, DDPJOB_SIGTERM_BUDGET_SECONDS=str(budget)) for i in range(2)]
    for a in agents:
        job.training_pid(a)
    job.progress_at_least(3, 120)
    sent = time.monotonic()
    agents[0].send_signal(signal.SIGTERM)  # what the kubelet does to the pod's PID 1 (the exec'ed torchrun)
    code = wait_exit(agents[0], budget + 15, job)
    elapsed = time.monotonic() - sent
    assert code == 143, f"exit code {code}; logs:\n{job.tails()}"
    assert elapsed < budget, f"took {elapsed:.1f}s, budget {budget}s"
    logs = job.logs()
    assert "preempted: checkpoint step-" in logs
    saved = [int(p.name.split("-")[1]) for p in job.ckpt_dir.glob("step-*") if (p / "COMPLETE.json").is_file()]
    assert saved and max(saved) >= 3, f"no final checkpoint (every_steps=0, so only SIGTERM saves): {saved}"
    assert read_json(job.progress)["globalStep"] <= max(saved)  # nothing trained after the final save is lost
    # The other pod's worker saw the flag, saved with everyone and exited 143 too: never 0, which its agent
    # would take for success (the job would end "Succeeded" half-trained).
    wait_until(lambda: "exitcode: 143" in job.log(1).read_text(), 30, "agent 1's worker to exit 143")
    assert agents[1].poll() != 0


def run_entrypoint(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddpjob_worker.entrypoint", *args], env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("variable", "value", "expect"), [
    (contract.PET_RDZV_ENDPOINT, None, "PET_RDZV_ENDPOINT is not set"),
    (contract.PET_NNODES, "two", "PET_NNODES='two' is malformed: use N or MIN:MAX"),
    (contract.DDPJOB_WORKER_INDEX, "-1", "DDPJOB_WORKER_INDEX='-1' must be >= 0"),
    # User knobs arrive unchecked through envFrom: the message names the variable, not float()'s complaint.
    (contract.DDPJOB_DNS_WAIT_SECONDS, "soon", "DDPJOB_DNS_WAIT_SECONDS='soon' must be a number of seconds >= 0"),
    (contract.DDPJOB_WARM_TRAINERS, "maybe", "DDPJOB_WARM_TRAINERS='maybe' must be 0 or 1"),
])
def test_broken_contract_exits_78_naming_the_variable(job: LocalJob, variable: str, value: str | None,
                                                      expect: str) -> None:
    env = job.env(0)
    if value is None:
        del env[variable]
    else:
        env[variable] = value
    proc = run_entrypoint(env, "--", "python", "train.py")
    assert proc.returncode == contract.EXIT_BAD_CONTRACT == 78
    assert expect in proc.stderr and "broken environment contract" in proc.stderr


@pytest.mark.timeout(60)
def test_help_and_missing_command() -> None:
    proc = run_entrypoint(dict(os.environ), "--help")
    assert proc.returncode == 0 and "usage: ddp-worker" in proc.stdout and "78" in proc.stdout


@pytest.mark.timeout(200)
def test_sigterm_with_a_45s_save_and_a_90s_grace_period_commits_the_checkpoint(job: LocalJob) -> None:
    """The operator gives the pod a 90 s grace period and the trainer a budget of 90 - 30 = 60 s. torchrun's agent
    used to SIGKILL its workers 30 s after SIGTERM whatever the budget, so a 45 s save never finished."""
    grace, budget, save = 90, 60, 45
    agent = job.agent(0, ["python", str(SCRIPTS / "slow_save.py")], nnodes="1", max_restarts=0,
                      DDPJOB_SIGTERM_BUDGET_SECONDS=str(budget), SAVE_SECONDS=str(save))
    job.training_pid(agent)
    wait_until(lambda: "TRAINING" in job.log(0).read_text(), 120, "training to start")
    time.sleep(1)
    sent = time.monotonic()
    agent.send_signal(signal.SIGTERM)
    code = wait_exit(agent, grace + 10, job)
    elapsed = time.monotonic() - sent
    logs = job.log(0).read_text()
    assert code == 143, logs[-3000:]
    assert save <= elapsed < grace, f"exited {elapsed:.1f}s after SIGTERM"
    assert "preempted: checkpoint step-" in logs, logs[-3000:]
    assert [p.name for p in job.ckpt_dir.glob("step-*") if (p / "COMPLETE.json").is_file()], "no committed save"

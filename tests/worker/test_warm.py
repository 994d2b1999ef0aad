"""Pre-started trainers with real torchrun agents: a restart after kill -9 runs in the process that was waiting
(not a new one), fault tools do not mistake a waiting trainer for the trainer, and a waiting trainer dies with
its agent."""

from __future__ import annotations

import os
import signal

import pytest
from ddpjob_worker import contract, procs

from tests.worker.helpers import TINY, LocalJob, wait_until

pytestmark = pytest.mark.torchrun
COMMAND = ["python", "-m", "ddpjob_worker.examples.charlm", *TINY, "--epochs", "1", "--steps-per-epoch", "100000",
           "--checkpoint-every", "5", "--step-delay", "0.05"]


@pytest.mark.timeout(300)
def test_restart_runs_in_the_prestarted_trainer_which_dies_with_its_agent(job: LocalJob) -> None:
    agent = job.agent(0, COMMAND, nnodes="1", max_restarts=3)
    first = job.training_pid(agent, timeout=120)
    job.progress_at_least(6, 120)
    # The first trainer was started by the launcher before it imported torch, and the agent kept it.
    log = job.log(0)
    assert f"local rank 0: trainer pre-started at launch (pid {first})" in log.read_text(), job.tails()
    assert f"local rank 0: keeping the trainer pre-started at launch (pid {first})" in log.read_text()
    # The first start took the trainer started with the agent; the next one follows REFILL_DELAY_SECONDS later.
    waiting = wait_until(lambda: procs.standbys(agent.pid, ready=True), 90, "a pre-started trainer")
    assert len(waiting) == 1 and waiting[0] != first, (waiting, first)
    assert procs.training_processes(agent.pid) == [first]
    job.orphans.update(waiting)

    os.kill(first, signal.SIGKILL)
    second = wait_until(lambda: [p for p in procs.training_processes(agent.pid) if p != first], 90,
                        "the restarted trainer")
    assert second == waiting, job.tails()  # the very process that waited, not a new one
    assert procs.comm(second[0]) != contract.STANDBY_PROCESS_NAME
    line = f"the pre-started trainer (pid {second[0]}) takes this rank (its imports were done)"
    wait_until(lambda: line in log.read_text(), 30, "the agent's log line")
    # It trains with the restarted group's environment: it resumed from a checkpoint (restart count 1).
    wait_until(lambda: "resumed from checkpoint step-" in log.read_text(), 120, "the resume", interval=0.5)
    assert not procs.is_standby(second[0])

    refilled = wait_until(lambda: procs.standbys(agent.pid), 90, "the next pre-started trainer")
    job.orphans.update(refilled)
    os.kill(agent.pid, signal.SIGKILL)
    # PR_SET_PDEATHSIG: a SIGKILLed agent (a node's OOM killer, a crashed launcher) leaves no idle trainer behind.
    wait_until(lambda: not procs.alive(refilled[0]), 10, "the waiting trainer to die with its agent")

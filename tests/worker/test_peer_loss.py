"""A silent peer noticed from inside the job (ddpjob_worker.peerwatch, ddpjob_worker.membership), with real torchrun
agents: a frozen pod (its agent and trainer SIGSTOPped: a node powered off or cut off, as its peers see it) is
removed from the round within the peer timeout and the hot spare takes its place; a slow rank (a step far longer
than the timeout) and a briefly frozen agent are not taken for dead.

Before, the survivors waited in a collective with the frozen peer until its timeout (charlm: 120 s), and the spare
could not join: a fixed-size group never restarts for a waiting node."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import pytest
from ddpjob_worker import contract, procs

from tests.worker.helpers import TINY, LocalJob, wait_exit, wait_until

pytestmark = pytest.mark.torchrun
#: The detection budget of these tests (the default is 5 s): short, so the tests are; every verdict scales with it.
BUDGET = 3
JOINED = "rendezvous complete: this pod is in the group"
REFORM = "re-forming the group without using a restart"


def charlm(steps: int, *extra: str) -> list[str]:
    return ["python", "-m", "ddpjob_worker.examples.charlm", *TINY, "--epochs", "1", "--steps-per-epoch", str(steps),
            "--checkpoint-every", "5", "--step-delay", "0.1", *extra]


def start(job: LocalJob, command: list[str], count: int) -> list[subprocess.Popen[bytes]]:
    env = {contract.DDPJOB_PEER_TIMEOUT_SECONDS: str(BUDGET)}
    return [job.agent(i, command, **env) for i in range(count)]


def in_group(job: LocalJob, count: int) -> list[int]:
    return [i for i in range(count) if JOINED in job.log(i).read_text()]


def freeze(job: LocalJob, pid: int, sig: signal.Signals) -> list[int]:
    """Signal an agent and every process under it (the whole pod, as a powered-off node stops it)."""
    tree = [pid, *procs.descendants(pid)]
    job.orphans.update(tree)
    for p in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, sig)
    return tree


@pytest.mark.timeout(400)
def test_a_frozen_pod_is_removed_within_the_peer_timeout_and_the_spare_takes_its_place(job: LocalJob) -> None:
    agents = start(job, charlm(60), 3)
    job.progress_at_least(8, 150)
    training = in_group(job, 3)
    assert len(training) == 2, job.tails()
    victim, survivor = training[-1], training[0]
    spare = next(i for i in range(3) if i not in training)
    tree = freeze(job, agents[victim].pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        wait_until(lambda: job.log(spare).read_text().count(JOINED) == 1, 60, "the spare to join the next group")
        took = time.monotonic() - t0
    finally:
        for p in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGCONT)
    survivor_log = job.log(survivor).read_text()
    assert "silent for" in survivor_log and f"(peerTimeoutSeconds {BUDGET})" in survivor_log, survivor_log[-3000:]
    assert REFORM in survivor_log, survivor_log[-3000:]
    # Detection (the budget and a poll), the eviction, the survivor's kill and the new round (a poll or two).
    assert took < BUDGET + 6, f"the spare joined {took:.1f}s after the freeze\n{job.tails()}"
    # Thawed, the frozen pod finds itself out of the round: it kills its trainer and waits as the next spare.
    wait_until(lambda: "this pod was removed from its rendezvous round" in job.log(victim).read_text(), 60,
               "the thawed pod to see that it was removed")
    for i in (survivor, spare, victim):
        assert wait_exit(agents[i], 240, job) == 0, job.tails()
    assert "resumed from checkpoint step-" in job.log(survivor).read_text()
    print(f"frozen pod: the spare joined the group {took:.1f}s after the freeze (peer timeout {BUDGET}s)")


@pytest.mark.timeout(300)
def test_a_slow_rank_and_a_briefly_frozen_agent_are_not_taken_for_dead(job: LocalJob) -> None:
    """The last rank sleeps 3 x the budget in one step (the others wait for it in the next all-reduce): its agent
    beats on. Then an agent is frozen for half the budget. Neither restarts anything: one group from start to end."""
    agents = start(job, charlm(40, "--pause-at-step", "12", "--pause-seconds", str(3 * BUDGET)), 2)
    job.progress_at_least(14, 200)
    assert "pausing" in job.logs(), job.tails()
    tree = freeze(job, agents[0].pid, signal.SIGSTOP)
    time.sleep(BUDGET / 2)
    freeze(job, agents[0].pid, signal.SIGCONT)
    assert tree
    for agent in agents:
        assert wait_exit(agent, 200, job) == 0, job.tails()
    logs = job.logs()
    assert REFORM not in logs and "silent for" not in logs, logs[-4000:]
    assert all(job.log(i).read_text().count(JOINED) == 1 for i in range(2)), logs[-4000:]

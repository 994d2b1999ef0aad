"""A lost rendezvous store (its pod deleted, its node lost) with real torchrun agents: the group keeps training,
every agent reconnects to the new store and restores the rendezvous state, and a later fault still re-forms the
group through the new store, a hot spare taking the lost pod's place (ddpjob_worker.storekeeper)."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from ddpjob_worker import procs

from tests.worker.helpers import TINY, LocalJob, wait_exit, wait_until

pytestmark = pytest.mark.torchrun

RECONNECTED = "reconnected to the rendezvous store"
COMMAND = ["python", "-m", "ddpjob_worker.examples.charlm", *TINY, "--epochs", "1", "--steps-per-epoch", "400",
           "--checkpoint-every", "5", "--step-delay", "0.05"]


def _trainers(agents: list[subprocess.Popen[bytes]]) -> dict[int, list[int]]:
    return {i: pids for i, a in enumerate(agents) if (pids := procs.training_processes(a.pid))}


@pytest.mark.timeout(420)
def test_store_loss_keeps_the_group_training_and_the_spare_waiting(job: LocalJob) -> None:
    agents = [job.agent(i, COMMAND) for i in range(3)]  # nnodes 2: two train, one waits as a hot spare
    job.progress_at_least(5, 180)
    training = wait_until(lambda: len(t := _trainers(agents)) == 2 and t, 60, "two agents with a trainer")
    spare = next(i for i in range(3) if i not in training)
    for pids in training.values():
        job.orphans.update(pids)

    job.restart_store()
    wait_until(lambda: all(RECONNECTED in job.log(i).read_text() for i in range(3)), 90,
               "every agent, the spare's included, to reconnect to the new store")
    step = int(job.progress_at_least(0, 1)["globalStep"])
    job.progress_at_least(step + 10, 120)
    assert _trainers(agents) == training, "the store's loss restarted a trainer"
    assert "exit 200" not in job.logs() and "RendezvousConnectionError" not in job.log(spare).read_text()

    # A later fault goes through the new store: one training pod lost, the spare takes its place.
    lost = max(training)
    os.kill(agents[lost].pid, signal.SIGKILL)
    for pid in training[lost]:
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: procs.training_processes(agents[spare].pid), 120, "the spare to take the lost pod's place")
    for i in (min(training), spare):
        assert wait_exit(agents[i], 300, job) == 0, job.logs()[-4000:]

"""A lost rendezvous store (its pod deleted, its node lost) with real torchrun agents: the group keeps training,
every agent reconnects to the new store and restores the rendezvous state, and a later fault still re-forms the
group through the new store, a hot spare taking the lost pod's place (ddpjob_worker.storekeeper)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

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
        assert wait_exit(agents[i], 300, job) == 0, job.tails()


@pytest.mark.timeout(240)
def test_sigterm_while_the_agent_reconnects_to_the_store_stops_the_pod_within_its_budget(job: LocalJob) -> None:
    """The store pod was deleted and its name does not answer yet (in a cluster: DNS not updated, so each attempt
    waits its whole second), and the new store comes up while the SIGTERM of a pod deletion is pending: torchrun's
    SignalException was then raised in the Python code of a successful attempt, which the keeper caught as "store
    not back yet". The SIGTERM was lost and the trainers trained on until the kubelet's SIGKILL (the soak's 45 s
    deletions, and a job that finished while one of its workers was being deleted)."""
    budget = 20
    agents = [job.agent(i, COMMAND, DDPJOB_SIGTERM_BUDGET_SECONDS=str(budget)) for i in range(2)]
    for a in agents:
        job.training_pid(a)
    job.progress_at_least(5, 180)
    job.rdzv.terminate()
    job.rdzv.wait(30)
    # An address whose connection attempts time out: a listener that never accepts, its backlog (0: one queued
    # connection) filled by ours, so the kernel drops the agents' SYNs and each attempt retries for its 1 s.
    silent = socket.create_server(("127.0.0.1", job.port), backlog=0)
    filler = socket.create_connection(("127.0.0.1", job.port), timeout=2)
    wait_until(lambda: "the rendezvous store is unreachable" in job.log(0).read_text(), 60,
               "agent 0 to notice the store is gone")
    time.sleep(3)  # several attempts in: the SIGTERM lands inside one
    sent = time.monotonic()
    agents[0].send_signal(signal.SIGTERM)
    filler.close()
    silent.close()
    job.start_store()  # the store is back while that attempt still retries
    code = wait_exit(agents[0], budget + 15, job)
    elapsed = time.monotonic() - sent
    assert code == 143, f"exit code {code}; logs:\n{job.tails()}"
    assert elapsed < budget, f"took {elapsed:.1f}s, budget {budget}s"
    assert "preempted: checkpoint step-" in job.log(0).read_text()

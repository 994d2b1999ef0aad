"""The pod agent with real torchrun agents: a failed agent leaves the rendezvous open for its replacement, a
survivor does not spend restarts on a peer's death, and the root cause reaches the exit code and the
termination log."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from ddpjob_worker import restart_request

from tests.worker.helpers import TINY, LocalJob, read_json, wait_exit, wait_until

pytestmark = pytest.mark.torchrun
SCRIPTS = Path(__file__).parent / "scripts"
OUTCOME = ["python", str(SCRIPTS / "outcome.py")]


@pytest.mark.timeout(240)
def test_failed_agent_leaves_the_rendezvous_open_for_its_replacement(job: LocalJob) -> None:
    """torchrun's launch_agent closed the rendezvous after any failure, so every later agent of the run got
    RendezvousClosedError: a replaced pod could never rejoin its job."""
    log = job.workdir / "termination-0"
    failed = job.agent(0, OUTCOME, nnodes="1", max_restarts=0, OUTCOME="sigkill",
                       DDPJOB_TERMINATION_LOG=str(log))
    assert wait_exit(failed, 120, job) == 137, job.tails()
    assert log.read_text() == "killed by signal SIGKILL (rank 0, exit code 137)\n"
    replacement = job.agent(0, OUTCOME, nnodes="1", max_restarts=0, OUTCOME="ok")
    assert wait_exit(replacement, 150, job) == 0, job.tails()
    assert "OUTCOME ok rank 0" in job.logs()


@pytest.mark.timeout(240)
def test_an_agent_that_starts_after_the_job_finished_exits_0(job: LocalJob) -> None:
    """The job succeeded, so its rendezvous is closed; a pod that starts only then (a replacement or a restarted
    container that came up late: the hot-spare test saw it under load) finds it closed when it joins. The job is
    done: it exits 0, not 200 ("rendezvous lost"), which would ask for yet another replacement."""
    first = job.agent(0, OUTCOME, nnodes="1", max_restarts=0, OUTCOME="ok")
    assert wait_exit(first, 150, job) == 0, job.tails()
    late = job.agent(1, OUTCOME, nnodes="1", max_restarts=0, OUTCOME="ok")
    assert wait_exit(late, 150, job) == 0, job.tails()
    assert "the rendezvous was closed before this pod joined: the job is done" in job.log(1).read_text()
    assert job.logs().count("OUTCOME ok rank 0") == 1, "the late pod ran the script again"


@pytest.mark.timeout(120)
def test_script_exception_is_the_termination_message(job: LocalJob) -> None:
    """A plain script (no @record of its own) still reports its exception, through the recorded runner."""
    log = job.workdir / "termination-0"
    agent = job.agent(0, OUTCOME, nnodes="1", max_restarts=0, OUTCOME="raise", DDPJOB_TERMINATION_LOG=str(log))
    assert wait_exit(agent, 100, job) == 1, job.tails()
    assert log.read_text() == "ValueError: learning rate must be positive, got -0.1 (rank 0, exit code 1)\n"


@pytest.mark.timeout(300)
def test_survivor_restarts_for_a_lost_peer_without_using_its_restarts(job: LocalJob) -> None:
    """Agent 0 may not restart at all (max_restarts=0) and pod 1 is lost (agent and trainer SIGKILLed). Agent 0's
    trainer fails with gloo's "Connection reset/closed by peer": the peer's failure, so agent 0 restarts for free,
    waits in the rendezvous for the replacement pod and the job finishes (before, agent 0 gave up: exit 1)."""
    command = ["python", "-m", "ddpjob_worker.examples.charlm", *TINY, "--epochs", "1", "--steps-per-epoch", "30",
               "--checkpoint-every", "5", "--step-delay", "0.05"]
    agents = [job.agent(i, command, max_restarts=0) for i in range(2)]
    job.training_pid(agents[0])
    lost = job.training_pid(agents[1])
    job.progress_at_least(6, 120)
    os.kill(agents[1].pid, signal.SIGKILL)
    os.kill(lost, signal.SIGKILL)
    wait_until(lambda: "because a peer was lost" in job.log(0).read_text(), 60, "agent 0 to see the peer loss")
    replacement = job.agent(1, command, max_restarts=0)
    for a in (agents[0], replacement):
        assert wait_exit(a, 200, job) == 0, job.tails()
    survivor = job.log(0).read_text()
    assert "restarting it without using one of the 0 restarts" in survivor
    assert "resumed from checkpoint step-" in job.logs()


@pytest.mark.timeout(400)
def test_hot_spare_takes_a_deleted_pods_place_at_once_and_exits_0_at_the_end(job: LocalJob) -> None:
    """Three agents for a 2-node group: one waits in torchrun's redundancy list. Agent 1 gets SIGTERM (its pod is
    deleted): it checkpoints, leaves the round and exits; the survivor and the spare form the next group well
    within the 15 s a departed participant's heartbeat takes to expire (the floor before agents left the round),
    with no extra restart for a waiting node; the job finishes and the spare of the end exits 0."""
    command = ["python", "-m", "ddpjob_worker.examples.charlm", *TINY, "--epochs", "1", "--steps-per-epoch", "40",
               "--checkpoint-every", "5", "--step-delay", "0.1"]
    agents = [job.agent(i, command) for i in range(3)]
    job.progress_at_least(6, 150)
    joined = "rendezvous complete: this pod is in the group"
    training = [i for i in range(3) if joined in job.log(i).read_text()]
    spare = next(i for i in range(3) if i not in training)
    assert len(training) == 2, job.tails()
    victim = training[-1]
    before = job.log(spare).read_text().count(joined)
    t0 = time.monotonic()
    os.kill(agents[victim].pid, signal.SIGTERM)
    wait_until(lambda: job.log(spare).read_text().count(joined) > before, 60, "the spare to join the next group")
    took = time.monotonic() - t0
    assert took < 14, f"the spare joined {took:.1f}s after the SIGTERM\n{job.tails()}"
    assert "left the rendezvous round" in job.log(victim).read_text()
    assert wait_exit(agents[victim], 60, job) == 143
    replacement = job.agent(victim, command)  # what the operator does: it becomes the next spare
    survivor = next(i for i in training if i != victim)
    for proc in (agents[survivor], agents[spare], replacement):
        assert wait_exit(proc, 240, job) == 0, job.tails()
    # The replacement waited as the spare of the end, or (its start slowed by a loaded machine) came up after the
    # job finished: either way the job is done without it.
    late = job.log(victim).read_text()
    assert ("the rendezvous closed while this pod waited as a hot spare" in late
            or "the rendezvous was closed before this pod joined" in late), job.tails()
    assert job.log(survivor).read_text().count(joined) == 2, "a waiting node restarted the full group"


@pytest.mark.timeout(300)
def test_a_group_whose_store_never_comes_back_trains_to_the_end(job: LocalJob) -> None:
    """The agent's periodic num_nodes_waiting() is how it learns that the store is gone (it syncs with it). A
    healthy group keeps training without it (ddpjob_worker.storekeeper); when no store ever comes back, the job
    still ends: no exit barrier on the lost store, and exit 0 (before: every agent exited 200 at once and every
    pod of the job was replaced; tests/worker/test_store_loss.py covers a store that comes back)."""
    command = ["python", "-m", "ddpjob_worker.examples.charlm", *TINY, "--epochs", "1", "--steps-per-epoch", "150",
               "--checkpoint-every", "5", "--step-delay", "0.1"]
    agents = [job.agent(i, command) for i in range(2)]
    job.progress_at_least(6, 150)
    os.kill(job.rdzv.pid, signal.SIGKILL)
    for proc in agents:
        assert wait_exit(proc, 200, job) == 0, job.tails()
    assert job.progress_at_least(150, 1)["globalStep"] >= 150
    logs = job.logs()
    assert "the rendezvous store is unreachable" in logs and "not waiting for the other agents" in logs


@pytest.mark.timeout(300)
@pytest.mark.parametrize("skew", [-600.0, 600.0], ids=["operator clock behind", "operator clock ahead"])
def test_a_restart_request_restarts_a_hung_group_in_place_from_its_checkpoint(job: LocalJob, skew: float) -> None:
    """The operator's in-place stall restart (ddpjob_worker.restart_request): one trainer hangs (SIGSTOP), each agent
    finds a request of an incident it has not seen in its file (the pod annotation, projected), stops its trainers
    and re-forms the group in place, without spending a restart (max_restarts=0); training resumes from the last
    checkpoint and the job ends. The request, still in the files when the new group forms, is obeyed once. The
    request's time is the operator's clock, ``skew`` seconds off the workers': never compared (behind, the request
    was ignored; ahead, obeyed again at every new group)."""
    command = ["python", "-m", "ddpjob_worker.examples.charlm", *TINY, "--epochs", "1", "--steps-per-epoch", "40",
               "--checkpoint-every", "5", "--step-delay", "0.1"]
    files = [job.workdir / f"restart-request-{i}" for i in range(2)]
    agents = [job.agent(i, command, max_restarts=0, DDPJOB_RESTART_REQUEST_FILE=str(files[i])) for i in range(2)]
    job.training_pid(agents[0])
    hung = job.training_pid(agents[1])
    job.progress_at_least(8, 150)
    os.kill(hung, signal.SIGSTOP)
    request = restart_request.Request(7, time.time() + skew)
    for f in files:  # the kubelet swaps the projected file atomically
        f.with_suffix(".tmp").write_text(request.text())
        f.with_suffix(".tmp").rename(f)
    for a in agents:
        assert wait_exit(a, 200, job) == 0, job.tails()
    logs = job.logs()
    assert logs.count("the operator asked this group to restart in place (incident #7") == 2, logs[-4000:]
    assert "resumed from checkpoint step-" in logs
    # Rank 0 reported how long its last write and the resume's load took (the operator's checkpoint histograms).
    progress = read_json(job.progress)
    assert progress["lastCheckpoint"]["seconds"] > 0 and progress["start"]["checkpointLoadSeconds"] > 0, progress

"""A script that checkpoints like the Hugging Face Trainer (rank 0 writes the checkpoint, every rank its RNG file,
every rank resumes from the newest checkpoint it finds in its own folder), run by real torchrun agents with one
folder each (an emptyDir per pod) and nothing of ddpjob in the script: a kill -9 of a trainer and a lost pod
(agent and folder gone, a new one started) both resume every rank from the same checkpoint, bitwise."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from ddpjob_worker import contract, procs

from tests.cluster.controlplane import free_port
from tests.worker.helpers import LocalJob, wait_exit, wait_until

pytestmark = pytest.mark.torchrun

SCRIPT = str(Path(__file__).parent / "scripts" / "rank0_checkpoints.py")
TOTAL, EVERY = 40, 4
COMMAND = ["python", SCRIPT, "unused", str(TOTAL), str(EVERY)]


class Pods:
    """Two agents standing for two pods: each its own checkpoint folder and replication port."""

    def __init__(self, job: LocalJob) -> None:
        self.job = job
        self.ports = [free_port(), free_port()]

    def folder(self, i: int) -> Path:
        return self.job.workdir / f"pod-{i}"

    def start(self, i: int, pause: float) -> subprocess.Popen[bytes]:
        peers = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        return self.job.agent(i, [*COMMAND, str(pause)], **{
            contract.DDPJOB_CHECKPOINT_DIR: str(self.folder(i)), "OUT_DIR": str(self.folder(i) / "hf"),
            contract.DDPJOB_REPLICATION: "1", contract.DDPJOB_REPLICA_PORT: str(self.ports[i]),
            contract.DDPJOB_REPLICA_PEERS: peers, contract.DDPJOB_REPLICA_ADDRESS: "127.0.0.1",
            contract.DDPJOB_WARM_TRAINERS: "0"})


def final_digest(job: LocalJob) -> str:
    found = re.findall(r"FINAL ([0-9a-f]{64})", job.logs())
    assert found, job.tails()
    return str(found[-1])


def resumes(job: LocalJob, pod: int) -> list[str]:
    """The checkpoint each start of pod ``pod``'s trainer resumed from, in order (its name, or none)."""
    return [Path(p).name for p in re.findall(r"RESUMED_FROM=(\S+) rank \d", job.log(pod).read_text())]


FILES = ("model.pt", "optimizer.pt", "rng_state_0.pth", "rng_state_1.pth", "trainer_state.json")


def newest(folder: Path) -> int:
    """The newest checkpoint this pod holds in full (every rank's part)."""
    steps = [int(d.name.split("-")[1]) for d in folder.glob("hf/checkpoint-*") if all((d / f).exists() for f in FILES)]
    return max(steps, default=0)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    job = LocalJob(tmp_path_factory.mktemp("reference"))
    try:
        pods = Pods(job)
        agents = [pods.start(i, 0.0) for i in range(2)]
        for a in agents:
            assert wait_exit(a, 300, job) == 0, job.tails()
        return final_digest(job)
    finally:
        job.close()


@pytest.mark.timeout(600)
def test_a_kill_and_a_lost_pod_resume_every_rank_from_the_same_checkpoint(job: LocalJob, reference: str) -> None:
    pods = Pods(job)
    agents = [pods.start(i, 0.25) for i in range(2)]
    # Rank 0's checkpoint (and the other rank's RNG file) reach the other pod whole.
    wait_until(lambda: min(newest(pods.folder(0)), newest(pods.folder(1))) >= 8, 240, "checkpoint-8 on both pods")
    os.kill(job.training_pid(agents[0]), signal.SIGKILL)
    wait_until(lambda: len(resumes(job, 0)) >= 2 and len(resumes(job, 1)) >= 2, 180, "the group restarted in place")
    wait_until(lambda: min(newest(pods.folder(0)), newest(pods.folder(1))) >= 20, 240, "checkpoint-20 on both")
    replicated = min(newest(pods.folder(0)), newest(pods.folder(1)))
    # Pod 1 lost: its agent and its emptyDir gone; a new pod of the same name joins with an empty folder.
    procs.stop_tree(agents[1], grace=0)
    shutil.rmtree(pods.folder(1))
    agents[1] = pods.start(1, 0.0)
    for a in agents:
        assert wait_exit(a, 400, job) == 0, job.tails()
    first, second = resumes(job, 0), resumes(job, 1)
    assert len(first) == len(second) == 3, (first, second)
    assert first[0] == second[0] == "none"
    assert first[1] == second[1] != "none", "both ranks resume from one checkpoint after the kill"
    assert first[2] == second[2], "both ranks resume from one checkpoint after the pod loss"
    assert int(first[2].split("-")[1]) >= replicated, f"resumed from {first[2]}, before checkpoint-{replicated}"
    assert final_digest(job) == reference

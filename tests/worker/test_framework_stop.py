"""A framework that stops every rank when one rank gets SIGTERM, as PyTorch Lightning does under DDP, with real
torchrun agents (tests/worker/scripts/sigterm_broadcast.py follows Lightning's code): when a pod is stopped, the
other pods' trainers exit 0 mid-run. torchrun took that for the end of their work, their agents waited at the exit
barrier and the replacement pod never found a group (seen with Lightning 2.6.6, 2026-12-06). Now the survivor's
exit is a peer's loss (ddpjob_worker.frameworks): its agent re-forms the group with the replacement and the job
finishes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ddpjob_worker import procs

from tests.worker.helpers import LocalJob, wait_exit, wait_until

pytestmark = pytest.mark.torchrun

SCRIPT = str(Path(__file__).parent / "scripts" / "sigterm_broadcast.py")
COMMAND = ["python", SCRIPT, "30", "0.2"]


def rank_of(job: LocalJob, index: int) -> int | None:
    found = re.findall(r"STEP \d+ rank (\d)", job.log(index).read_text())
    return int(found[-1]) if found else None


@pytest.mark.timeout(400)
def test_a_stopped_rank0_pod_makes_the_others_re_form_the_group_not_finish(job: LocalJob) -> None:
    agents = [job.agent(i, COMMAND) for i in range(2)]
    wait_until(lambda: all(len(re.findall(r"STEP \d+", job.log(i).read_text())) >= 5 for i in range(2)), 180,
               "five steps on both pods")
    stopped = next(i for i in range(2) if rank_of(job, i) == 0)  # the rank whose SIGTERM is broadcast
    survivor = 1 - stopped
    procs.stop_tree(agents[stopped], grace=30)  # the pod is deleted: its agent forwards SIGTERM to the trainer
    wait_until(lambda: "PeerStopped" in job.log(survivor).read_text(), 60, "the survivor's trainer stopping for it")
    agents[stopped] = job.agent(stopped, COMMAND)  # the replacement pod
    for a in agents:
        assert wait_exit(a, 240, job) == 0, job.tails()
    survived = job.log(survivor).read_text()
    assert "worker group failed because a peer was lost" in survived, job.tails()
    assert "exit barrier" not in survived, job.tails()
    assert len(re.findall(r"DONE rank \d", job.logs())) == 2, job.tails()

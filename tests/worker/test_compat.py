"""The torch compatibility layer with real torchrun agents, on whichever torch runs the tests (make test-compat
runs them under each release of TORCH_COMPAT_VERSIONS). The other fallbacks have their torchrun test where the
behaviour lives: the SIGTERM budget on a torch without --shutdown-timeout in test_faults.py (a 45 s save with a
60 s budget, cut at 30 s without it), the rendezvous that torch 2.6's agent closed on every failure in
test_agent.py (test_failed_agent_leaves_the_rendezvous_open_for_its_replacement)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.worker.helpers import LocalJob, wait_exit

pytestmark = pytest.mark.torchrun
OUTCOME = ["python", str(Path(__file__).parent / "scripts" / "outcome.py")]


@pytest.mark.timeout(180)
def test_a_cold_start_runs_and_the_probe_is_logged_once(job: LocalJob) -> None:
    """Without pre-started trainers every worker starts through torchrun's own get_subprocess_handler, called with
    the arguments this torch takes (torch 2.6's has no numa_options: every cold start raised TypeError); a second
    start (the restart after the first run's failure) is cold too."""
    agent = job.agent(0, OUTCOME, nnodes="1", max_restarts=1, OUTCOME="raise", DDPJOB_WARM_TRAINERS="0")
    assert wait_exit(agent, 150, job) == 1, job.tails()
    log = job.log(0).read_text()
    assert log.count("OUTCOME raise rank 0") == 2, log[-3000:]  # the first start and the restart both ran
    assert "TypeError" not in log, log[-3000:]
    assert "trainer pre-started at launch" not in log and "the pre-started trainer (pid" not in log, log[-3000:]
    probes = [line for line in log.splitlines() if "ddpjob.compat:" in line]
    assert len(probes) == 1, probes
    assert f"torch {torch.__version__}: shutdown budget via " in probes[0]

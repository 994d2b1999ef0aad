"""``ddpjob run`` ends a job by the cluster's success rule (policies/success.py, issue 43 #15): the first agent
that exits 0 proves training completed; the job succeeds once the others ended, or closeTimeoutSeconds after that
first success (an elastic straggler waiting for a closed rendezvous would otherwise hang the run), and no agent is
replaced after it. Agents here are small Python processes standing for torchrun agents."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ddpjob_operator.api.spec import RunPolicy
from ddpjob_operator.cli.local_run import Agent, Rules, _supervise
from rich.console import Console

EXIT_0 = "import sys; sys.exit(0)"
HANG = "import time; time.sleep(600)"


class Run:
    """Agents running ``scripts`` under _supervise in a thread; every process is killed at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.agents: list[Agent] = []
        self.result: list[int] = []
        self.output = tmp_path / "console.txt"

    def start(self, scripts: list[str], close_timeout: int) -> float:
        for i, script in enumerate(scripts):
            agent = Agent(i, [sys.executable, "-c", script], {}, self.tmp_path / f"worker-{i}.log")
            agent.start(self.tmp_path)
            self.agents.append(agent)
        console = Console(file=self.output.open("w"), force_terminal=False, width=200)
        rules = Rules(RunPolicy(backoff_limit=3), close_timeout)
        thread = threading.Thread(target=lambda: self.result.append(
            _supervise("j", self.agents, rules, self.tmp_path / "progress.json", None, console)), daemon=True)
        started = time.monotonic()
        thread.start()
        thread.join(60)
        return time.monotonic() - started

    def stop(self) -> None:
        for agent in self.agents:
            if agent.proc is not None and agent.proc.poll() is None:
                agent.proc.kill()
                agent.proc.wait(10)


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Run]:
    r = Run(tmp_path)
    yield r
    r.stop()


def test_an_elastic_straggler_does_not_hold_the_job_past_the_close_timeout(run: Run) -> None:
    took = run.start([EXIT_0, HANG], close_timeout=2)
    assert run.result == [0], f"the run did not end in 60 s with a straggler: {run.output.read_text()[-2000:]}"
    assert took < 30, took  # 2 s after the first success, with the margin of a loaded machine
    assert "stopping worker(s) 1, still running after spec.rendezvous.closeTimeoutSeconds (2s)" in \
        run.output.read_text()
    assert run.agents[1].replacements == 0


def test_after_the_first_success_a_failed_agent_is_not_replaced_and_the_job_succeeds(run: Run) -> None:
    late_failure = "import time, sys; time.sleep(1); sys.exit(1)"
    run.start([EXIT_0, late_failure], close_timeout=300)
    assert run.result == [0] and run.agents[1].replacements == 0 and run.agents[1].exit_code == 1


def test_before_any_success_a_failed_agent_is_replaced(run: Run, tmp_path: Path) -> None:
    """Unchanged: the failure policy judges an agent that fails while none succeeded (200: the store was lost,
    retried), and its replacement's success ends the job."""
    marker = tmp_path / "failed-once"
    script = f"import pathlib, sys; m = pathlib.Path({str(marker)!r}); sys.exit(0 if m.exists() else m.touch() or 200)"
    run.start([script], close_timeout=300)
    assert run.result == [0] and run.agents[0].replacements == 1

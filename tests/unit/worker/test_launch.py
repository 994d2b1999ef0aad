"""launch's exit codes and termination messages, the SIGTERM budget it hands torchrun, and PodAgent's two
changes to torchrun's agent (rendezvous kept open on failure, peer losses not counted as restarts)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
import torch.distributed.launcher.api as launcher_api
import torch.distributed.run as torch_run
from ddpjob_worker import agent, compat, contract, launch
from torch.distributed.elastic.agent.server.api import RunResult, WorkerSpec, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.elastic.rendezvous import api as rdzv_api

from tests.unit.worker.test_causes import GLOO_PEER_KILLED_ERROR_FILE, GLOO_PEER_KILLED_LINE

ARGV = ["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=h:1", "train.py"]


@pytest.fixture
def termination_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "termination-log"
    monkeypatch.setenv(contract.DDPJOB_TERMINATION_LOG, str(path))
    return path


def raising(err: BaseException) -> Any:
    def run(_args: object) -> None:
        raise err

    return run


def failure(tmp_path: Path, rank: int, exitcode: int, error_file: str | None) -> ProcessFailure:
    path = tmp_path / f"error-{rank}.json"
    if error_file is not None:
        path.write_text(error_file)
    return ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=exitcode, error_file=str(path))


def user_error(message: str) -> str:
    return json.dumps({"message": {"message": message, "extraInfo": {
        "py_callstack": f"Traceback (most recent call last):\n  File \"t.py\", line 1, in <module>\n{message}\n",
        "timestamp": "1"}}})


@pytest.mark.parametrize(("worker", "container"), [(-9, 137), (-15, 143), (143, 143), (78, 78), (1, 1), (0, 1)])
def test_exit_code_is_the_root_cause(worker: int, container: int) -> None:
    assert launch.exit_code_for_worker(worker) == container


@pytest.mark.parametrize("error", [rdzv_api.RendezvousConnectionError, rdzv_api.RendezvousStateError,
                                   rdzv_api.RendezvousTimeoutError, rdzv_api.RendezvousClosedError,
                                   rdzv_api.RendezvousError, dist.DistNetworkError, dist.DistStoreError])
def test_every_rendezvous_failure_is_retryable(monkeypatch: pytest.MonkeyPatch, termination_log: Path,
                                               error: type[Exception]) -> None:
    """Deleting the rendezvous pod made torchrun exit 1, which the default policy reads as permanent; a timed-out
    or closed rendezvous did too. All must exit EXIT_RENDEZVOUS_LOST (>= 128) and say why."""
    monkeypatch.setattr(torch_run, "run", raising(error("The connection to the C10d store has failed.")))
    assert launch.main(ARGV) == contract.EXIT_RENDEZVOUS_LOST == 200
    assert termination_log.read_text() == (f"{error.__name__}: The connection to the C10d store has failed. "
                                           "(rendezvous lost, exit code 200)\n")


def test_agent_signal_exits_128_plus_n(monkeypatch: pytest.MonkeyPatch, termination_log: Path) -> None:
    monkeypatch.setattr(torch_run, "run", raising(SignalException("got 15", signal.SIGTERM)))
    assert launch.main(ARGV) == 143
    assert termination_log.read_text() == "agent received SIGTERM; workers stopped (exit code 143)\n"


@pytest.mark.parametrize(("failures", "code", "line"), [
    ({1: (1, user_error("ValueError: bad lr"))}, 1, "ValueError: bad lr (rank 1, exit code 1)"),
    ({0: (-9, None)}, 137, "killed by signal SIGKILL (rank 0, exit code 137)"),
    ({0: (3, None)}, 3, "exited with code 3 without an error file (rank 0, exit code 3)"),
    ({0: (1, GLOO_PEER_KILLED_ERROR_FILE)}, 201, f"{GLOO_PEER_KILLED_LINE} (rank 0, exit code 1)"),
    # One worker of this pod failed on its own: the pod is not a mere casualty, its own code is retried/counted.
    ({0: (1, GLOO_PEER_KILLED_ERROR_FILE), 1: (-9, None)}, 1, f"{GLOO_PEER_KILLED_LINE} (rank 0, exit code 1)"),
])
def test_child_failure_exit_code_and_termination_message(
        monkeypatch: pytest.MonkeyPatch, termination_log: Path, tmp_path: Path,
        failures: dict[int, tuple[int, str | None]], code: int, line: str) -> None:
    err = ChildFailedError("train.py", {r: failure(tmp_path, r, c, f) for r, (c, f) in failures.items()})
    monkeypatch.setattr(torch_run, "run", raising(err))
    assert launch.main(ARGV) == code
    assert termination_log.read_text() == line + "\n"


def test_unwritable_termination_log_does_not_change_the_exit_code(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    monkeypatch.setenv(contract.DDPJOB_TERMINATION_LOG, str(tmp_path / "missing" / "termination-log"))
    monkeypatch.setattr(torch_run, "run", raising(rdzv_api.RendezvousTimeoutError("timed out")))
    assert launch.main(ARGV) == contract.EXIT_RENDEZVOUS_LOST


def test_sigterm_budget_reaches_the_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.15's launch_agent passes its own shutdown_timeout (default 30) to the agent, so there the budget must
    travel through torchrun's option, not an agent constructor default; older torchruns have no such option and
    PodAgent applies it itself (tests/unit/worker/test_compat.py)."""
    seen: list[Any] = []

    def launch_agent(config: Any, *_: Any, **__: Any) -> dict[int, Any]:
        seen.append(config)
        return {}

    monkeypatch.setattr(launcher_api, "launch_agent", launch_agent)
    monkeypatch.setenv(contract.DDPJOB_SIGTERM_BUDGET_SECONDS, "60")
    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)
    monkeypatch.setattr(agent, "_shutdown_seconds", None)
    assert launch.main(["--nnodes=1", "--rdzv-backend=c10d", "--rdzv-endpoint=h:1", "train.py"]) == 0
    assert agent._shutdown_seconds == 60 + launch.SHUTDOWN_MARGIN_SECONDS
    if compat.capabilities().shutdown_timeout:
        assert seen[0].shutdown_timeout == 60 + launch.SHUTDOWN_MARGIN_SECONDS


@pytest.mark.parametrize(("explicit", "env", "expected"), [(None, {}, 65), (None, {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT":
                                                                                   "120"}, 120), (10, {}, 65)])
def test_shutdown_timeout_is_the_budget_or_more(explicit: int | None, env: dict[str, str], expected: int) -> None:
    environ = {contract.DDPJOB_SIGTERM_BUDGET_SECONDS: "60", **env}
    assert launch.shutdown_timeout(explicit, environ) == expected


class FakeHandler:
    """Just enough of a RendezvousHandler for an agent that never rendezvouses."""

    def __init__(self) -> None:
        self.shutdowns = 0

    def get_run_id(self) -> str:
        return "run-1"

    def shutdown(self) -> bool:
        self.shutdowns += 1
        return True


def make_agent(max_restarts: int = 3) -> tuple[agent.PodAgent, FakeHandler]:
    handler = FakeHandler()
    spec = WorkerSpec(role="trainer", local_world_size=1, rdzv_handler=handler,  # type: ignore[arg-type]
                      entrypoint="train.py", max_restarts=max_restarts)
    return agent.PodAgent(spec, logs_specs=DefaultLogsSpecs()), handler


@pytest.mark.parametrize(("outcome", "closes"), [(WorkerState.SUCCEEDED, True), (WorkerState.FAILED, False),
                                                 (rdzv_api.RendezvousTimeoutError("t"), False)])
def test_only_a_successful_agent_closes_the_rendezvous(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                       outcome: Any, closes: bool) -> None:
    pod_agent, handler = make_agent()

    def invoke_run(self: LocalElasticAgent, role: str) -> RunResult:
        if isinstance(outcome, Exception):
            raise outcome
        fails = {0: failure(tmp_path, 0, 1, None)} if outcome == WorkerState.FAILED else {}
        return RunResult(state=outcome, failures=fails)

    monkeypatch.setattr(LocalElasticAgent, "_invoke_run", invoke_run)
    for name in ("_shutdown", "_record_metrics", "_record_worker_events"):  # bookkeeping a fake run cannot feed
        monkeypatch.setattr(LocalElasticAgent, name, lambda self, *a, **k: None)
    with pytest.raises(Exception) if isinstance(outcome, Exception) else _nothing():
        pod_agent.run()
    pod_agent._worker_group.spec.rdzv_handler.shutdown()  # what launch_agent's finally does
    assert handler.shutdowns == (1 if closes else 0)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.mark.parametrize(("error_file", "exitcode", "spent"), [
    (GLOO_PEER_KILLED_ERROR_FILE, 1, 0),       # a peer died: free restart
    (user_error("ValueError: bad lr"), 1, 1),  # own bug: counted, so a crash loop ends
    (None, -9, 1),                             # own worker SIGKILLed (OOM): counted
])
def test_peer_loss_does_not_use_up_restarts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                            error_file: str | None, exitcode: int, spent: int) -> None:
    pod_agent, _ = make_agent(max_restarts=2)
    result = RunResult(state=WorkerState.FAILED, failures={0: failure(tmp_path, 0, exitcode, error_file)})
    monkeypatch.setattr(LocalElasticAgent, "_monitor_workers", lambda self, group: result)
    assert pod_agent._monitor_workers(pod_agent._worker_group) is result
    pod_agent._remaining_restarts -= 1  # what _invoke_run does next
    assert pod_agent._remaining_restarts == 2 - spent


def test_install_makes_torchrun_build_the_pod_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher_api, "LocalElasticAgent", LocalElasticAgent)
    agent.install()
    agent.install()  # idempotent
    assert launcher_api.LocalElasticAgent is agent.PodAgent  # type: ignore[attr-defined]


@pytest.mark.parametrize(("nodes", "seconds"), [(1, 0.1), (2, 0.1), (10, 0.1), (30, 0.3), (64, 0.64), (100, 1.0),
                                                (2000, 1.0)])
def test_poll_seconds_scale_with_the_nodes(nodes: int, seconds: float) -> None:
    assert agent.poll_seconds(nodes) == pytest.approx(seconds)


def test_tune_polls_sets_the_state_cache_too() -> None:
    class Holder:
        _cache_duration = 1.0

    class Settings:
        max_nodes = 4

    class Handler:
        _settings, _state_holder = Settings(), Holder()

    handler = Handler()
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    module: Any = dynamic_rendezvous
    before = module._delay
    try:
        assert agent.tune_polls(handler) == pytest.approx(0.1)
        assert handler._state_holder._cache_duration == pytest.approx(0.1)
    finally:
        module._delay = before
    assert agent.tune_polls(object()) is None


def test_the_rendezvous_poll_is_shortened_and_nothing_else(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    module: Any = dynamic_rendezvous
    monkeypatch.setattr(module, "_delay", module._delay)  # restored after the test
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    compat.shorten_rendezvous_poll(0.1)
    module._delay(seconds=1)  # the poll of a waiting agent (torch passes it by keyword)
    module._delay(seconds=0.5)  # anything else keeps its delay
    assert slept == [0.1, 0.5]


LEAVING = """
import threading, time
from ddpjob_worker import launch
from ddpjob_worker.logs import get_logger

threading.Thread(target=time.sleep, args=(60,), daemon=True).start()  # still running at exit, as torch's may be
print("stdout line", end="")  # no newline: still in the buffer
get_logger("launch").warning("the agent's last log line")
launch.leave(143)
"""


def test_the_agent_leaves_with_its_code_and_its_last_lines() -> None:
    """launch.leave: the exit code, and what was still buffered, without the interpreter's teardown (which can abort
    an agent whose daemon threads are inside torch's C++: exit -6 instead of 143)."""
    done = subprocess.run([sys.executable, "-c", LEAVING], capture_output=True, text=True, timeout=60)
    assert done.returncode == 143, done.stderr
    assert done.stdout == "stdout line"
    assert "the agent's last log line" in done.stderr

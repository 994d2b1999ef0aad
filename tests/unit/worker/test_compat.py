"""The torch compatibility layer: the probe reads each capability off torch's own code and fails closed, the log
line names the behaviour chosen, and each fallback does what the newer torch does natively (the SIGTERM budget
applied by the agent, torchrun's handler called with exactly the options torch gave, the rendezvous detached from
torch 2.6's agent shutdown). Runs under every torch of the matrix (make test-compat)."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
from typing import Any

import pytest
import torch
import torch.distributed.elastic.multiprocessing.api as mp_api
from ddpjob_worker import agent, compat, warm
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing.api import SignalException

from tests.unit.worker.test_launch import make_agent

BUDGET = 65


@pytest.fixture
def caps(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Set this torch's capabilities for one test: ``caps(shutdown_timeout=False)``."""
    def set_caps(**changes: Any) -> compat.Capabilities:
        value = dataclasses.replace(compat._probe(), **changes)
        monkeypatch.setattr(compat, "_capabilities", value)
        return value

    return set_caps


def test_assigns_reads_the_attribute_names_a_function_uses() -> None:
    class Holder:
        def __init__(self) -> None:
            self._token = None
            self._cache_duration = 1

    assert compat.assigns(Holder.__init__, ["_token", "_cache_duration"])
    assert not compat.assigns(Holder.__init__, ["_token", "_dirty"])


def test_a_failing_check_means_the_capability_is_missing() -> None:
    def moved() -> bool:
        raise AttributeError("module has no attribute '_delay'")

    assert compat._checked(moved) is False
    assert compat._checked(lambda: True) is True


def test_the_probe_line_names_the_version_and_each_choice() -> None:
    caps = compat._probe()
    line = caps.describe()
    assert line.startswith(f"torch {torch.__version__}: shutdown budget via ")
    for part in ("numa_options", "agent closes the rendezvous", "pre-started trainers", "restart refund",
                 "leave round", "fast polls", "store reconnect"):
        assert part in line
    old = dataclasses.replace(caps, shutdown_timeout=False, numa_options=False, agent_closes_rendezvous=True,
                              subprocess_handler=False)
    assert old.describe().startswith(f"torch {torch.__version__}: shutdown budget via agent override, "
                                     "numa_options no, agent closes the rendezvous: yes, detached, pod agent yes, "
                                     "pre-started trainers no (cold starts)")


def test_a_torch_26_agent_shutdown_is_recognised(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.6's LocalElasticAgent._shutdown: no timeout, and it shuts the rendezvous down itself."""
    def shutdown_26(self: Any, death_sig: signal.Signals = signal.SIGTERM, is_restart: bool = False) -> None:
        if not is_restart and self._rdzv_handler:
            self._rdzv_handler.shutdown()

    class Handler26:
        def __init__(self, entrypoint: str, args: tuple[Any, ...], env: dict[str, str], stdout: str | None,
                     stderr: str | None, local_rank_id: int) -> None:
            pass

        def _popen(self, args: Any, env: Any) -> None:
            return None

    monkeypatch.setattr(LocalElasticAgent, "_shutdown", shutdown_26)
    monkeypatch.setattr(compat, "_subprocess_handler_class", lambda: Handler26)
    caps = compat._probe()
    assert not caps.shutdown_timeout and caps.agent_closes_rendezvous and not caps.numa_options


def test_the_budget_goes_into_torchruns_arguments_only_where_it_has_the_option(caps: Any) -> None:
    class Args:
        shutdown_timeout: int | None = None

    caps(shutdown_timeout=False)
    args = Args()
    assert not compat.set_shutdown_timeout(args, BUDGET) and args.shutdown_timeout is None
    caps(shutdown_timeout=True)
    assert compat.set_shutdown_timeout(args, BUDGET) and args.shutdown_timeout == BUDGET


class Workers:
    """A process context that records how it was closed."""

    def __init__(self) -> None:
        self.closed: list[tuple[signal.Signals, int]] = []

    def close(self, death_sig: signal.Signals, timeout: int = 30) -> None:
        self.closed.append((death_sig, timeout))


def shutdown(pod_agent: agent.PodAgent, signalled: bool) -> None:
    """Call the agent's _shutdown as SimpleElasticAgent.run does: from its ``except SignalException`` block when the
    agent got a signal, without one at the end of a run."""
    if not signalled:
        pod_agent._shutdown()
        return
    try:
        raise SignalException("got 15", signal.SIGTERM)
    except SignalException as err:
        pod_agent._shutdown(err.sigval)


@pytest.mark.parametrize(("native", "signalled", "closes"), [(False, True, [(signal.SIGTERM, BUDGET)]),
                                                            (False, False, []), (True, True, [])])
def test_without_torchruns_option_the_agent_gives_the_workers_the_budget_after_a_signal(
        monkeypatch: pytest.MonkeyPatch, caps: Any, native: bool, signalled: bool, closes: list[Any]) -> None:
    """torch 2.6 and 2.10 wait a fixed 30 s after forwarding the SIGTERM; a restart keeps torch's own timeout."""
    caps(shutdown_timeout=native)
    monkeypatch.setattr(agent, "_shutdown_seconds", BUDGET)
    monkeypatch.setattr(LocalElasticAgent, "_shutdown", lambda self, *a, **k: None)  # torch's own close
    pod_agent, _ = make_agent()
    workers = Workers()
    monkeypatch.setattr(pod_agent, "_pcontext", workers, raising=False)
    shutdown(pod_agent, signalled)
    assert workers.closed == closes


@pytest.mark.parametrize("closes", [True, False])
def test_the_rendezvous_is_detached_from_an_agent_that_would_close_it(caps: Any, closes: bool) -> None:
    caps(agent_closes_rendezvous=closes)
    pod_agent, handler = make_agent()
    held = getattr(pod_agent, "_rdzv_handler", None)
    if closes:
        assert held is None
    elif held is not None:  # torch 2.10 and 2.15 still hold it, without closing it
        assert held is handler


def test_a_restart_is_refunded_only_where_restarts_are_counted() -> None:
    pod_agent, _ = make_agent(max_restarts=2)
    assert compat.refund_restart(pod_agent) and pod_agent._remaining_restarts == 3
    assert not compat.refund_restart(object())


@pytest.mark.parametrize("options", [{}, {"numa_options": None}])
def test_a_cold_start_calls_torchruns_handler_with_the_options_torch_gave(
        monkeypatch: pytest.MonkeyPatch, options: dict[str, Any]) -> None:
    """torch 2.6's get_subprocess_handler takes no numa_options: passing one failed every cold start."""
    seen: list[dict[str, Any]] = []

    def original(**kwargs: Any) -> str:
        seen.append(kwargs)
        return "torch's handler"

    monkeypatch.setattr(warm, "_original_handler", original)
    monkeypatch.setenv("DDPJOB_WARM_TRAINERS", "0")
    assert warm.make_handler("python", ("train.py",), {}, None, None, 0, **options) == "torch's handler"
    assert set(seen[0]) == {"entrypoint", "args", "env", "stdout", "stderr", "local_rank_id", *options}


def test_install_keeps_torchs_handler_as_the_fallback(monkeypatch: pytest.MonkeyPatch, caps: Any) -> None:
    from torch.distributed.elastic.multiprocessing.subprocess_handler import get_subprocess_handler as original

    module: Any = mp_api
    monkeypatch.setattr(module, "get_subprocess_handler", original)  # as torch left it, whatever ran before
    monkeypatch.setattr(warm, "_original_handler", None)
    caps(subprocess_handler=False)
    warm.install()
    assert warm._original_handler is None and module.get_subprocess_handler is original
    caps(subprocess_handler=True)
    warm.install()
    warm.install()  # idempotent: torch's handler stays the fallback
    assert warm._original_handler is original and module.get_subprocess_handler is warm.make_handler


def test_an_adopted_process_is_torchs_handler_around_it_and_starts_nothing() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        handler = compat.adopted_handler(proc, 3)
        assert handler.proc is proc and handler.local_rank_id == 3
        assert handler.proc.poll() is None
        handler.close(signal.SIGTERM)  # torch's close: the signal to the process group
        assert proc.wait(10) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_pod_agent_is_not_installed_where_its_overrides_would_not_apply(
        monkeypatch: pytest.MonkeyPatch, caps: Any) -> None:
    import torch.distributed.launcher.api as launcher_api

    monkeypatch.setattr(launcher_api, "LocalElasticAgent", LocalElasticAgent)
    caps(agent_class=False)
    assert not compat.install_agent_class(agent.PodAgent)
    assert launcher_api.LocalElasticAgent is LocalElasticAgent  # type: ignore[attr-defined]
    caps(agent_class=True)
    assert compat.install_agent_class(agent.PodAgent)
    assert launcher_api.LocalElasticAgent is agent.PodAgent  # type: ignore[attr-defined]


def test_a_store_client_is_torchs_public_tcpstore() -> None:
    from datetime import timedelta

    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # type: ignore[attr-defined]
    client = compat.connect_store("127.0.0.1", server.port, timedelta(seconds=5), timedelta(seconds=7),
                                  compat.store_uses_libuv(server))
    client.set("k", "v")
    assert server.get("k") == b"v" and client.timeout == timedelta(seconds=7)


def test_the_supported_range_is_the_one_the_matrix_runs() -> None:
    """pyproject's torch extra, the runtime's own check (contract) and the matrix (hack/versions.env) name one
    range: a release outside the matrix is not promised anywhere."""
    import re
    import tomllib
    from pathlib import Path

    from ddpjob_worker import contract

    repo = Path(__file__).resolve().parents[3]
    line = next(x for x in (repo / "hack" / "versions.env").read_text().splitlines()
                if x.startswith("TORCH_COMPAT_VERSIONS="))
    matrix = [tuple(int(p) for p in v.split(".")[:2]) for v in line.split("=", 1)[1].strip('"').split()]
    assert matrix == sorted(matrix) and matrix[0] == contract.TORCH_MIN_VERSION
    assert matrix[-1] == contract.TORCH_MAX_TESTED_VERSION
    extras = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pin = next(r for r in extras["torch"] if r.startswith("torch"))
    # The worker extra goes into users' images: it never asks for torch, so pip never replaces theirs.
    assert not [r for r in extras["worker"] if r.startswith("torch")]
    low, high = contract.TORCH_MIN_VERSION, contract.TORCH_MAX_TESTED_VERSION
    assert re.sub(r"\s", "", pin) == f"torch>={low[0]}.{low[1]},<{high[0]}.{high[1] + 1}"


def test_a_destroyed_process_group_stays_referenced(tmp_path: Any) -> None:
    """The gloo teardown hang (compat.keep_process_groups): destroy_process_group keeps what it removes, in a
    subprocess so this test's process keeps its own torch.distributed as it was."""
    script = f"""
import gc, weakref, torch.distributed as dist
from ddpjob_worker import compat
compat.keep_process_groups()
compat.keep_process_groups()  # twice: wrapped once
dist.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=0, world_size=1)
default = dist.distributed_c10d._get_default_group()
side = dist.new_group(backend="gloo")
dist.destroy_process_group(side)
dist.destroy_process_group()
print(dist.destroy_process_group.keeps_groups, len(compat._kept_groups),
      any(g is default for g in compat._kept_groups), any(g is side for g in compat._kept_groups))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    last = out.stdout.strip().splitlines()[-1]  # after what gloo itself prints on some releases (2.10)
    assert last.split() == ["True", "2", "True", "True"], out.stdout + out.stderr


@pytest.mark.parametrize(("version", "may_hang"), [
    ("2.6.0+cu124", True), ("2.10.0", True), ("2.14.1", True), ("2.6.0a0+ecf3bae.nv25.01", True), ("weird", True),
    ("2.15.0+cu132", False), ("2.16.0", False), ("3.0.0", False),
])
def test_the_trainers_exit_by_os_exit_below_the_release_seen_never_to_hang(
        monkeypatch: pytest.MonkeyPatch, version: str, may_hang: bool) -> None:
    monkeypatch.setattr(torch, "__version__", version)
    assert compat.gloo_teardown_may_hang() is may_hang

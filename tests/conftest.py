"""Shared pytest fixtures: a session-scoped local cluster, a fresh namespace per test, and wait helpers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


#: Seconds per test (setup, call and teardown) and the outcome, for `make test`'s timing table (hack/timings.py).
_DURATIONS: dict[str, list[Any]] = {}


def _tier(nodeid: str) -> str:
    top = nodeid.split("/")[1] if nodeid.startswith("tests/") else ""
    return {"worker": "torchrun"}.get(top, top)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add up each test's phases (under xdist the controller sees every worker's reports)."""
    entry = _DURATIONS.setdefault(report.nodeid, [0.0, "passed"])
    entry[0] += report.duration
    if report.failed:
        entry[1] = "failed"


def pytest_sessionfinish(session: pytest.Session) -> None:
    """With DDPJOB_TIMINGS set: one row per e2e test, one per other tier (the sum of its tests' times)."""
    path = os.environ.get("DDPJOB_TIMINGS")
    if not path or hasattr(session.config, "workerinput") or not _DURATIONS:
        return
    rows: list[str] = []
    tiers: dict[str, list[float]] = {}
    for nodeid, (seconds, outcome) in _DURATIONS.items():
        tier = _tier(nodeid)
        if tier == "e2e":
            rows.append(f"  e2e: {nodeid.rsplit('::', 1)[-1]}\t{seconds:.1f}\t{outcome}")
        else:
            tiers.setdefault(tier, []).append(seconds)
    rows += [f"  {tier}: {len(times)} tests (sum)\t{sum(times):.1f}\t" for tier, times in sorted(tiers.items())]
    with open(path, "a") as f:
        f.write("".join(row + "\n" for row in rows))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test by its directory so `-m unit` / `-m integration` select whole tiers. Under pytest-xdist
    (`make test-fast` runs `-n 2 --dist loadgroup`) the integration tier stays on one worker: its tests share that
    worker's control plane while the other worker runs the unit and torchrun tests, which mostly wait on different
    things (the API server's round trips against torch's imports and training steps)."""
    for item in items:
        parts = Path(str(item.fspath)).parts
        for tier in ("unit", "integration", "e2e"):
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))
        if "integration" in parts:
            item.add_marker(pytest.mark.xdist_group("control-plane"))


class Cluster:
    """A live cluster reachable through `kubeconfig`."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; on failure raise with kubectl's own stderr."""
        proc = subprocess.run(
            ["kubectl", f"--kubeconfig={self.kubeconfig}", *args], input=stdin, capture_output=True, text=True
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc

    def plugin_env(self) -> dict[str, str]:
        """A user's environment for kubectl plugins: this interpreter's bin (where pip put kubectl-ddpjob) first
        on the PATH, this cluster's kubeconfig."""
        return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                "KUBECONFIG": str(self.kubeconfig)}

    def ddpjob(self, *args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """`kubectl ddpjob ARGS` as a user runs it: kubectl finds the plugin on the PATH."""
        proc = subprocess.run(["kubectl", "ddpjob", *args], capture_output=True, text=True, env=self.plugin_env(),
                              timeout=timeout, check=False)
        if check:
            assert proc.returncode == 0, f"kubectl ddpjob {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}"
        return proc

    def api(self) -> Any:
        """A kubernetes.client.ApiClient for this cluster."""
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kubeconfig), client_configuration=cfg
        )
        return client.ApiClient(cfg)


def _live(kubeconfig: Path) -> bool:
    proc = subprocess.run(
        ["kubectl", f"--kubeconfig={kubeconfig}", "get", "--raw=/readyz", "--request-timeout=3s"],
        capture_output=True, text=True,
    )
    return proc.returncode == 0


def live_kubeconfig() -> Path | None:
    """KUBECONFIG when it points at a live cluster (the tests then use it as is), else None; fails the
    session when DDPJOB_REQUIRE_KUBECONFIG is set and the given cluster does not answer."""
    env = os.environ.get("KUBECONFIG")
    if env and _live(Path(env)):
        return Path(env)
    if env and os.environ.get("DDPJOB_REQUIRE_KUBECONFIG"):
        pytest.fail(f"KUBECONFIG={env} does not answer /readyz and DDPJOB_REQUIRE_KUBECONFIG is set")
    return None


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The cluster under test: KUBECONFIG if it points at a live cluster, else a fresh local control plane.

    The local one is started once per session and torn down at exit. If it cannot be built or started the
    tests fail with the reason; they are never skipped silently.
    """
    given = live_kubeconfig()
    if given is not None:
        yield Cluster(given)
        return
    from tests.cluster.controlplane import down, up

    directory = tmp_path_factory.mktemp("cluster")
    try:
        state = up(directory)
    except Exception as err:
        pytest.fail(f"could not start the local control plane: {err}", pytrace=False)
    try:
        yield Cluster(state.kubeconfig)
    finally:
        down(directory, quiet=True)


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test (its default ServiceAccount already exists), deleted afterwards."""
    name = f"t-{request.node.name[:40].lower().replace('_', '-').strip('-')}-{uuid.uuid4().hex[:5]}"
    name = "".join(c for c in name if c.isalnum() or c == "-")
    cluster.kubectl("create", "namespace", name)
    wait_for(
        lambda: cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
        timeout=30, describe=f"default ServiceAccount in {name}",
    )
    try:
        yield name
        from tests.readable import assert_readable

        assert_readable(cluster.kubectl, name)  # every test's failure messages: causes, never dumps
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def wait_for(
    check: Callable[[], T | bool | None],
    *,
    timeout: float,
    describe: str,
    interval: float = 0.25,
    state: Callable[[], object] | None = None,
) -> T:
    """Poll `check` until it returns something truthy; on timeout fail naming what was awaited and,
    when `state` is given, what the world looked like at the end."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while True:
        try:
            result = check()
            if result:
                return result  # type: ignore[return-value]
            last_exc = None
        except Exception as exc:
            last_exc = exc
        if time.monotonic() >= deadline:
            seen = ""
            if state is not None:
                try:
                    seen = f"\nlast observed state:\n{state()}"
                except Exception as exc:
                    seen = f"\n(could not read state: {exc})"
            err = f"\nlast error: {last_exc!r}" if last_exc else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {describe}{err}{seen}")
        time.sleep(interval)

"""The e2e runs that need no node to themselves run together, in threads, while the node-fault tests hold nodes
1-3 in the foreground: most of a run is waiting (a step every half second, a pod starting, a recovery), so three
runs at once cost about what one does. Each test waits for its own run's result and asserts on it as before.

A run is registered by name (``@runs_in_background("soak")``); a test that needs it carries
``pytest.mark.background("soak")`` and asks ``background.result("soak")``. The session fixture
(tests/e2e/conftest.py) starts the runs of the selected tests as soon as the operator is installed, the reference
run first, all pinned to node 0 where the cluster has fault nodes (their losses would hit these runs too).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from tests.e2e import training as t
from tests.e2e.runs import Env

#: Runs by name: ``fn(env)`` returns what its tests assert on.
RUNS: dict[str, Callable[[Env], Any]] = {}
#: Runs that start only once others ended: the soak takes the operator down, which would delay the stall
#: detection that test_progress.py times.
AFTER: dict[str, tuple[str, ...]] = {}
#: Runs at once: each 2-worker run holds ~2 GB (agents, trainers, pre-started trainers) of the machine's 24.
CONCURRENCY = 3
#: Started first: every comparison needs it.
FIRST = ("reference",)


def runs_in_background(name: str, *, after: tuple[str, ...] = ()
                       ) -> Callable[[Callable[[Env], Any]], Callable[[Env], Any]]:
    """Register ``fn(env)`` as the background run ``name``; it starts once the runs ``after`` (those selected)
    ended."""
    def register(fn: Callable[[Env], Any]) -> Callable[[Env], Any]:
        RUNS[name] = fn
        AFTER[name] = after
        return fn
    return register


def pinned(env: Env) -> Env:
    """``env`` with its runs kept on node 0 when the cluster has nodes that tests take down (node 0 runs the
    operator and is never faulted); on any other cluster, as it is."""
    from tests.cluster import netnodes
    from tests.e2e.conftest import REAL_NODE_LABEL

    fault_nodes = env.cluster.kubectl("get", "nodes", "-l", f"{netnodes.LABEL}=true", "-o", "name").stdout.split()
    node0 = env.cluster.kubectl("get", "nodes", "-l", f"{REAL_NODE_LABEL}-index=0", "-o", "name").stdout.split()
    if fault_nodes and node0:
        return dataclasses.replace(env, node_selector={f"{REAL_NODE_LABEL}-index": "0"})
    return env


class Background:
    """The session's background runs: started in order, ``CONCURRENCY`` at a time."""

    def __init__(self, env: Env, names: Iterable[str]) -> None:
        unknown = set(names) - RUNS.keys()
        assert not unknown, f"no background run registered as {sorted(unknown)}"
        # A run that waits for others is submitted after them, so it never holds a slot they need.
        order = [n for n in FIRST if n in names] + sorted(set(names) - set(FIRST),
                                                          key=lambda n: (bool(AFTER.get(n)), n))
        self._pool = ThreadPoolExecutor(CONCURRENCY, thread_name_prefix="e2e-run")
        self._futures: dict[str, Future[Any]] = {}
        for name in order:
            self._futures[name] = self._pool.submit(self._run, name, env)
        t.log(f"background runs started ({CONCURRENCY} at a time): {', '.join(order)}")

    def _run(self, name: str, env: Env) -> Any:
        wait([self._futures[n] for n in AFTER.get(name, ()) if n in self._futures])
        t.log(f"background run {name}: starting")
        try:
            return RUNS[name](env)
        finally:
            t.log(f"background run {name}: done")

    def result(self, name: str) -> Any:
        """The run's result (its exception, if it failed), once it is done."""
        return self._futures[name].result()

    def drain(self) -> None:
        """Wait until no background run is going (for a test that must be the only one with faults)."""
        wait(list(self._futures.values()))

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

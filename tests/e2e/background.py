"""The e2e runs run together, in threads: most of a run is waiting (a step every half second, a pod starting, a
recovery), so several runs at once cost about what one does. Each test waits for its own run's result and asserts
on it as before. The runs that take nodes down (test_nodes.py) get a lane of three fault nodes each, one run per
lane at a time (the session cluster has two lanes); the others run two at a time on node 0.

A run is registered by name (``@runs_in_background("soak")``); a test that needs it carries
``pytest.mark.background("soak")`` and asks ``background.result("soak")``. The session fixture
(tests/e2e/conftest.py) starts the runs of the selected tests as soon as the operator is installed, the reference
run first, all pinned to node 0 where the cluster has fault nodes (their losses would hit these runs too).
"""

from __future__ import annotations

import dataclasses
import queue
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import pytest

from tests.e2e import training as t
from tests.e2e.runs import Env

#: Runs by name: ``fn(env)`` returns what its tests assert on.
RUNS: dict[str, Callable[[Env], Any]] = {}
#: Runs that start only once others ended: the soak takes the operator down, which would delay the stall
#: detection that test_progress.py times.
AFTER: dict[str, tuple[str, ...]] = {}
#: Runs that take nodes down: each gets a lane of its own (three fault nodes: two for the workers, one for the
#: replacement), one run per lane at a time.
LANE_RUNS: set[str] = set()
#: Fault nodes per lane.
LANE_NODES = 3
#: The label that names a fault node's lane.
LANE_LABEL = "ddpjob.io/e2e-lane"
#: Runs at once on node 0, beside the lanes' runs: each 2-worker run holds ~2 GB (agents, trainers, pre-started
#: trainers) of the machine's 24 and ~0.3 of its 2 cores. Three at once plus two lanes (2026-11-29 CI) left the
#: machine so short that a torch import took 110 s and runs passed their timeouts; two at once do the same work.
CONCURRENCY = 2
#: Started first: every comparison needs it.
FIRST = ("reference",)


def runs_in_background(name: str, *, after: tuple[str, ...] = (), lane: bool = False
                       ) -> Callable[[Callable[[Env], Any]], Callable[[Env], Any]]:
    """Register ``fn(env)`` as the background run ``name``; it starts once the runs ``after`` (those selected)
    ended; ``lane``: it takes nodes down, and runs on a lane of fault nodes of its own (``env`` selects them)."""
    def register(fn: Callable[[Env], Any]) -> Callable[[Env], Any]:
        RUNS[name] = fn
        AFTER[name] = after
        if lane:
            LANE_RUNS.add(name)
        return fn
    return register


def lanes(env: Env) -> list[Env]:
    """The cluster's fault nodes (tests/cluster/netnodes.py) in lanes of LANE_NODES, each node labelled with its
    lane; an Env per lane that selects its nodes. None on a cluster without them (kind)."""
    from tests.cluster import netnodes

    names = env.cluster.kubectl("get", "nodes", "-l", f"{netnodes.LABEL}=true", "-o", "name").stdout.split()
    names.sort(key=lambda n: int(n.rsplit("-", 1)[-1]) if n.rsplit("-", 1)[-1].isdigit() else 0)
    out = []
    for k in range(len(names) // LANE_NODES):
        for node in names[k * LANE_NODES:(k + 1) * LANE_NODES]:
            env.cluster.kubectl("label", node, f"{LANE_LABEL}={k}", "--overwrite")
        out.append(dataclasses.replace(env, node_selector={LANE_LABEL: str(k)}))
    return out


def spare_nodes(cluster: Any) -> list[str]:
    """The fault nodes no lane uses (the last ``len % LANE_NODES`` of them): no test takes them down."""
    from tests.cluster import netnodes

    names = cluster.kubectl("get", "nodes", "-l", f"{netnodes.LABEL}=true", "-o", "name").stdout.split()
    names.sort(key=lambda n: int(n.rsplit("-", 1)[-1]) if n.rsplit("-", 1)[-1].isdigit() else 0)
    return [n.removeprefix("node/") for n in names[len(names) // LANE_NODES * LANE_NODES:]]


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


def _depth(name: str, names: set[str]) -> int:
    """0 for a run that waits for no selected run, else one more than the deepest run it waits for."""
    waits = [n for n in AFTER.get(name, ()) if n in names]
    return 1 + max(_depth(n, names) for n in waits) if waits else 0


class Background:
    """The session's background runs: started in order, ``CONCURRENCY`` at a time, and the runs that take nodes
    down one per lane at a time."""

    def __init__(self, env: Env, names: Iterable[str], lane_envs: list[Env]) -> None:
        unknown = set(names) - RUNS.keys()
        assert not unknown, f"no background run registered as {sorted(unknown)}"
        # A run that waits for others is submitted after them (and after what they wait for), so it never holds
        # a slot they need.
        order = [n for n in FIRST if n in names] + sorted(set(names) - set(FIRST),
                                                          key=lambda n: (_depth(n, set(names)), n))
        self._pool = ThreadPoolExecutor(CONCURRENCY, thread_name_prefix="e2e-run")
        self._lane_pool = ThreadPoolExecutor(max(1, len(lane_envs)), thread_name_prefix="e2e-lane")
        self._lanes: queue.Queue[Env] = queue.Queue()
        for lane in lane_envs:
            self._lanes.put(lane)
        self._futures: dict[str, Future[Any]] = {}
        for name in order:
            if name in LANE_RUNS:
                self._futures[name] = self._lane_pool.submit(self._on_lane, name, bool(lane_envs))
            else:
                self._futures[name] = self._pool.submit(self._run, name, env)
        t.log(f"background runs started ({CONCURRENCY} at a time, {len(lane_envs)} fault-node lane(s)): "
              f"{', '.join(order)}")

    def _run(self, name: str, env: Env) -> Any:
        wait([self._futures[n] for n in AFTER.get(name, ()) if n in self._futures])
        t.log(f"background run {name}: starting")
        try:
            return RUNS[name](env)
        finally:
            t.log(f"background run {name}: done")

    def _on_lane(self, name: str, have_lanes: bool) -> Any:
        if not have_lanes:
            pytest.skip(f"{name} needs the local multi-node cluster with {LANE_NODES} network-namespace nodes: "
                        "make cluster-up NODE=real NODES=4, or no KUBECONFIG")
        # Wait for the runs it comes after before taking a lane, so a lane never idles while another run needs it.
        wait([self._futures[n] for n in AFTER.get(name, ()) if n in self._futures])
        lane = self._lanes.get()
        try:
            return self._run(name, lane)
        finally:
            self._lanes.put(lane)

    def result(self, name: str) -> Any:
        """The run's result (its exception, if it failed), once it is done."""
        return self._futures[name].result()

    def drain(self) -> None:
        """Wait until no background run is going (for a test that must be the only one with faults)."""
        wait(list(self._futures.values()))

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._lane_pool.shutdown(wait=True, cancel_futures=True)

"""Process entry of the operator: logging, the /metrics server, leader election when asked, and kopf with a
/healthz liveness endpoint."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Coroutine
from typing import Any

import kopf

from ddpjob_operator.api import names
from ddpjob_operator.kube import kopf_compat, leader
from ddpjob_operator.metrics import registry as metrics
from ddpjob_operator.planner.policies import report_cadence

log = logging.getLogger("ddpjob")

#: Exit status of a leader that lost its Lease: the container restarts and waits as a standby.
EXIT_LEADERSHIP_LOST = 3


@dataclasses.dataclass(frozen=True, slots=True)
class Election:
    """Leader election's settings: the Lease ``namespace``/``name`` and its timing."""

    namespace: str
    name: str = names.LEADER_LEASE
    timing: leader.Timing = leader.DEFAULT_TIMING


def run_operator(namespaces: list[str], metrics_port: int, liveness_port: int, resync_seconds: float,
                 election: Election | None = None, runtime_image: str = "", worker_admission_policy: str = "",
                 report_budget: float = report_cadence.DEFAULT_BUDGET) -> int:
    """Run the operator until SIGINT/SIGTERM against the current kubeconfig or in-cluster config; with
    ``election``, only while this replica holds the leader Lease. ``runtime_image``: the injected runtime's image
    for jobs that name none (empty: what `make images` builds). ``worker_admission_policy``: the chart's
    ValidatingAdmissionPolicy to check (runtime/isolation.py; empty: none). ``report_budget``: routine progress
    writes per second for all running jobs (policies/report_cadence.py)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # kopf logs one line per handled watch event at INFO; at 500 jobs that drowns the operator's own lines.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    from ddpjob_operator.runtime import handlers  # registers the kopf handlers

    handlers.controller.namespaces = list(namespaces)
    handlers.controller.resync_seconds = resync_seconds
    handlers.controller.runtime_image = runtime_image
    handlers.controller.isolation.policy = worker_admission_policy
    handlers.controller.report_budget = report_budget

    metrics.serve(metrics_port)
    liveness = f"http://0.0.0.0:{liveness_port}/healthz" if liveness_port else None
    log.info("starting: namespaces=%s metrics_port=%d liveness=%s resync=%.0fs leader election=%s",
             namespaces or "all", metrics_port, liveness, resync_seconds,
             f"{election.namespace}/{election.name}" if election else "off")
    options = {"standalone": True, "clusterwide": not namespaces, "namespaces": namespaces,
               "liveness_endpoint": liveness}
    if election is None:
        metrics.LEADER.set(1)
        kopf.run(**options)  # type: ignore[arg-type]
    else:
        asyncio.run(_elected(election, liveness_port, options))
    return 0


async def _elected(election: Election, liveness_port: int, options: dict[str, object]) -> None:
    """Wait for the Lease (serving /healthz meanwhile), run kopf while it is held, release it after kopf's clean
    stop; exit at once when it is lost."""
    from ddpjob_operator.kube import lease_io

    api = lease_io.HttpLeases(election.namespace, election.name)
    elector = leader.Elector(api, lease_io.identity(), election.timing)
    metrics.LEADER.set(0)
    try:
        health = await lease_io.standby_health(liveness_port)
        try:
            acquired = await _until_stopped(elector.acquire())
        finally:
            if health is not None:
                await health.cleanup()
        if not acquired:
            log.info("stopped while waiting to lead")
            return
        leader.install(elector)
        kopf_compat.fence_events(leader.may_write)  # kopf posts Events past kube/client.py's fence
        keeper = asyncio.create_task(elector.keep(_lost))
        try:
            await kopf.operator(**options)  # type: ignore[arg-type]
        finally:
            keeper.cancel()
            await elector.release()
    finally:
        await api.close()


async def _until_stopped(waiting: Coroutine[Any, Any, object]) -> bool:
    """Run ``waiting`` until it ends (True) or SIGTERM/SIGINT comes (False). A standby needs handlers of its own:
    as a container's PID 1 it would ignore SIGTERM without one, and wait for the kubelet's SIGKILL (30 s of a
    rollout, a drain, a scale-down)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    task, stopped = asyncio.ensure_future(waiting), asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        for pending in (task, stopped):
            pending.cancel()
    if task.done() and not task.cancelled():
        task.result()  # its error, if any
        return True
    return False


def _lost() -> None:
    """Another replica may lead from now on: stop writing at once, not after kopf's graceful stop (its cleanup
    writes). Called from the lease watchdog's thread (leader.Watchdog), on time even while the event loop is held.
    The container restarts and waits as a standby."""
    log.critical("leadership lost: exiting (%d) so the new leader is the only writer", EXIT_LEADERSHIP_LOST)
    logging.shutdown()
    sys.stdout.flush()
    os._exit(EXIT_LEADERSHIP_LOST)

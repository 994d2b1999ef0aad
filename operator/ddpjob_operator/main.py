"""Process entry of the operator: logging, the /metrics server, and kopf with a /healthz liveness endpoint."""

from __future__ import annotations

import logging

import kopf

from ddpjob_operator import metrics


def run_operator(namespaces: list[str], metrics_port: int, liveness_port: int, resync_seconds: float) -> int:
    """Run the operator until SIGINT/SIGTERM against the current kubeconfig or in-cluster config."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # kopf logs one line per handled watch event at INFO; at 500 jobs that drowns the operator's own lines.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    from ddpjob_operator import handlers  # registers the kopf handlers

    handlers.controller.namespaces = list(namespaces)
    handlers.controller.resync_seconds = resync_seconds

    metrics.serve(metrics_port)
    liveness = f"http://0.0.0.0:{liveness_port}/healthz" if liveness_port else None
    logging.getLogger("ddpjob").info(
        "starting: namespaces=%s metrics_port=%d liveness=%s resync=%.0fs", namespaces or "all", metrics_port,
        liveness, resync_seconds,
    )
    kopf.run(
        standalone=True,
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=liveness,
    )
    return 0

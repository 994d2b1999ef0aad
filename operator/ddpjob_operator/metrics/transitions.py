"""Metrics of a written status's transitions: the time a job took to first run, Kueue's queueing and evictions.
Observed once per written status, from the status before the write and the one written."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ddpjob_operator.metrics import registry as metrics
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.kueue import admission


def _first_start(old: Mapping[str, Any]) -> bool:
    """True until the job has run once: never Running, Restarting or Suspended before."""
    seen = (st.RUNNING, st.RESTARTING, st.SUSPENDED)
    return (
        old.get("state") in (None, st.CREATED)
        and all(st.get_condition(old, c) is None or (c == st.RUNNING and not st.condition_true(old, c)) for c in seen)
        and not old.get("restarts")
    )


def observe_written(body: Mapping[str, Any], new: Mapping[str, Any], now: datetime) -> None:
    """``body``: the job the pass planned from; ``new``: the status it wrote."""
    old = body.get("status") or {}
    created = (body.get("metadata") or {}).get("creationTimestamp")
    if new.get("state") == st.RUNNING and _first_start(old) and created:
        start = datetime.fromisoformat(str(created).replace("Z", "+00:00"))
        metrics.TIME_TO_ALL_RUNNING.observe(max(0.0, (now - start).total_seconds()))
    waited, evicted = admission.transitions(old, new, now)
    if waited is not None:
        metrics.KUEUE_QUEUED.observe(max(0.0, waited))
    if evicted is not None:
        metrics.KUEUE_PREEMPTIONS.labels(reason=evicted).inc()

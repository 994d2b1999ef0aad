"""Figures over all known DDPJobs for the operator's /metrics, computed at scrape time from the bodies the
controller keeps: counts and maxima (the dashboard's), and per-job series that live as long as the job does, like
kube-state-metrics' per-object series: its global step (`kubectl ddpjob report --prometheus` draws its history) and
the figures the chart's alert rules (charts/ddpjob-operator/templates/prometheusrule.yaml) read, so that an alert
names the job. Pure: bodies and clock in, figures out."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from ddpjob_operator.api.formats import parse_time
from ddpjob_operator.api.spec import RunPolicy
from ddpjob_operator.planner import status as st

#: A job's incident budget is nearly spent once this share of spec.runPolicy.backoffLimit is used.
BUDGET_WARN_SHARE = 0.8
#: The default backoffLimit, for a body that does not spell it out.
DEFAULT_BACKOFF_LIMIT: int = RunPolicy.model_fields["backoff_limit"].default
#: States in which a job trains (or should): only these can be stalled or overdue for a checkpoint.
ACTIVE = (st.RUNNING, st.RESTARTING)


@dataclasses.dataclass(frozen=True)
class JobStats:
    #: Unfinished jobs whose incidents reached BUDGET_WARN_SHARE of their backoffLimit.
    budget_nearly_spent: int = 0
    #: Active jobs whose Stalled condition is True.
    stalled: int = 0
    #: Active jobs with an incident still recovering.
    recovering: int = 0
    #: The oldest last checkpoint among active jobs that reported one, in seconds (0 if none).
    max_checkpoint_age: float = 0.0


def _backoff_limit(body: Mapping[str, Any]) -> int:
    limit = ((body.get("spec") or {}).get("runPolicy") or {}).get("backoffLimit")
    return limit if isinstance(limit, int) and not isinstance(limit, bool) else DEFAULT_BACKOFF_LIMIT


def _true(status: Mapping[str, Any], ctype: str) -> bool:
    return any(c.get("type") == ctype and c.get("status") == "True" for c in status.get("conditions") or [])


def collect(bodies: Iterable[Mapping[str, Any]], now: datetime) -> JobStats:
    near = stalled = recovering = 0
    oldest = 0.0
    for body in bodies:
        status = body.get("status") or {}
        state = status.get("state")
        if state in (st.SUCCEEDED, st.FAILED):
            continue
        limit, count = _backoff_limit(body), status.get("incidentCount") or 0
        if limit > 0 and count >= BUDGET_WARN_SHARE * limit:
            near += 1
        if state not in ACTIVE:
            continue
        stalled += _true(status, st.STALLED)
        incidents = status.get("incidents") or []
        recovering += bool(incidents and incidents[-1].get("outcome") == "Recovering")
        saved = parse_time(((status.get("progress") or {}).get("lastCheckpoint") or {}).get("time"))
        if saved is not None:
            oldest = max(oldest, (now - saved).total_seconds())
    return JobStats(budget_nearly_spent=near, stalled=stalled, recovering=recovering, max_checkpoint_age=oldest)


@dataclasses.dataclass(frozen=True)
class JobFigures:
    """One job's figures for the alert rules (None: the figure does not apply to it now)."""

    namespace: str
    name: str
    #: An active job: 1.0 while its Stalled condition is True, else 0.0.
    stalled: float | None = None
    #: When its newest Stalled incident started (seconds since the epoch), if it has one.
    last_stall: float | None = None
    #: An unfinished job with a backoffLimit: the share of it its incidents used.
    budget_used: float | None = None
    #: An active job that reported a checkpoint: seconds since it.
    checkpoint_age: float | None = None


def per_job(bodies: Iterable[Mapping[str, Any]], now: datetime) -> list[JobFigures]:
    """The figures of every job that has a name."""
    out = []
    for body in bodies:
        meta, status = body.get("metadata") or {}, body.get("status") or {}
        if not meta.get("name"):
            continue
        state, active = status.get("state"), status.get("state") in ACTIVE
        stalls = [at for i in status.get("incidents") or [] if isinstance(i, Mapping) and i.get("cause") == st.STALLED
                  if (at := parse_time(i.get("startTime"))) is not None]
        limit, count = _backoff_limit(body), status.get("incidentCount") or 0
        saved = parse_time(((status.get("progress") or {}).get("lastCheckpoint") or {}).get("time"))
        out.append(JobFigures(
            str(meta.get("namespace") or ""), str(meta["name"]),
            stalled=float(_true(status, st.STALLED)) if active else None,
            last_stall=max(stalls).timestamp() if stalls else None,
            budget_used=count / limit if limit > 0 and state not in (st.SUCCEEDED, st.FAILED) else None,
            checkpoint_age=(now - saved).total_seconds() if active and saved is not None else None))
    return out


def global_steps(bodies: Iterable[Mapping[str, Any]]) -> list[tuple[str, str, int]]:
    """(namespace, name, global step) of every job whose progress reports one: finished jobs too, so the last
    step stays in the history until the job is deleted."""
    out = []
    for body in bodies:
        meta, step = body.get("metadata") or {}, ((body.get("status") or {}).get("progress") or {}).get("globalStep")
        if isinstance(step, int) and not isinstance(step, bool) and meta.get("name"):
            out.append((str(meta.get("namespace") or ""), str(meta["name"]), step))
    return out

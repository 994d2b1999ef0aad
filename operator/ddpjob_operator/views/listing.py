"""`kubectl ddpjob list`: one line per DDPJob: state, progress, incidents, time lost to failures, goodput. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from ddpjob_operator.views import facts

Obj = Mapping[str, Any]

COLUMNS = ("NAMESPACE", "NAME", "STATE", "READY", "PROGRESS", "INCIDENTS", "LOST", "GOODPUT", "AGE")


def _progress(status: Obj, now: datetime) -> str:
    p = facts.progress(status, now)
    if p.step is None:
        return "-"
    if p.total:
        return f"{p.step}/{p.total} ({p.fraction:.0%})"
    return f"step {p.step}"


def row(job: Obj, now: datetime) -> tuple[str, ...]:
    meta, status = job.get("metadata") or {}, job.get("status") or {}
    gp = facts.goodput(status, now)
    fraction = gp.fraction if gp is not None else None
    return (str(meta.get("namespace", "")), str(meta.get("name", "")), str(status.get("state") or "-"),
            str(status.get("ready") or "-"), _progress(status, now), str(status.get("incidentCount") or 0),
            facts.duration(gp.lost) if gp is not None else "-",
            f"{fraction:.1%}" if fraction is not None else "-",
            facts.duration(facts.since(meta.get("creationTimestamp"), now)))


def render(jobs: Sequence[Obj], now: datetime, *, namespaces: bool = True) -> str:
    """The table, sorted by namespace and name; without the NAMESPACE column when ``namespaces`` is false."""
    if not jobs:
        return "No DDPJobs found.\n"
    rows = [COLUMNS, *sorted(row(j, now) for j in jobs)]
    if not namespaces:
        rows = [r[1:] for r in rows]
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    return "".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n" for r in rows)

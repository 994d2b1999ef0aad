"""`kubectl ddpjob report JOB -o job.png`: a job's training timeline (global step over time) with each incident
shaded from its start to its recovery, checkpoints marked and the goodput in the title, from what the cluster
keeps: the status (start, incidents, the last step and checkpoint) and the Events (each `IncidentRecovered` says
the global step training resumed at), and with ``--prometheus`` the step at every scrape (views/prometheus.py).
``timeline`` is pure; ``draw`` needs matplotlib."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from ddpjob_operator.api import reasons
from ddpjob_operator.views import facts

Obj = Mapping[str, Any]

#: The operator's recovery Event: "incident #3 (NodeLost) recovered in 9s, training at global step 16 (...)".
_RESUMED = re.compile(r"incident #(\d+) \(\w+\) recovered in [^,]+, training at global step (\d+)")


@dataclasses.dataclass(frozen=True)
class Span:
    id: int
    cause: str
    start: datetime
    end: datetime
    open: bool  # still recovering (or failed): ``end`` is now or the job's end


@dataclasses.dataclass(frozen=True)
class Timeline:
    title: str
    #: (time, global step) points the cluster knows, in time order.
    points: list[tuple[datetime, int]]
    spans: list[Span]
    #: (time, step) of checkpoints the cluster knows (the last one; older ones are not kept).
    checkpoints: list[tuple[datetime, int]]
    #: (time, global step) at every Prometheus scrape, when read (empty: not asked for, or none there).
    series: list[tuple[datetime, int]] = dataclasses.field(default_factory=list)


def _resumes(events: Sequence[Obj]) -> dict[int, tuple[datetime | None, int]]:
    out: dict[int, tuple[datetime | None, int]] = {}
    for event in events:
        if event.get("reason") != reasons.INCIDENT_RECOVERED:
            continue
        if m := _RESUMED.search(str(event.get("message") or "")):
            out[int(m.group(1))] = (facts.event_time(event), int(m.group(2)))
    return out


def _spans(status: Obj, end: datetime) -> list[Span]:
    """Each incident from its start to the first step after it (a recovered one), or to ``end``."""
    spans = []
    for incident in status.get("incidents") or []:
        start = facts.parse_time(incident.get("startTime"))
        if start is None:
            continue
        closed = incident.get("outcome") == "Recovered"
        stop = start + timedelta(seconds=facts.incident_cost(incident, end)) if closed else end
        spans.append(Span(facts.as_int(incident.get("id")) or 0, str(incident.get("cause") or "?"), start,
                          min(stop, end), not closed))
    return spans


def timeline(job: Obj, events: Sequence[Obj], now: datetime,
             series: Sequence[tuple[datetime, int]] = ()) -> Timeline:
    meta, status = job.get("metadata") or {}, job.get("status") or {}
    end = facts.end_of(status, now)
    points: list[tuple[datetime, int]] = []
    if (started := facts.parse_time(status.get("startTime"))) is not None:
        points.append((started, 0))
    spans = _spans(status, end)
    resumes = _resumes(events)
    for span in spans:
        if span.id in resumes:
            at, step = resumes[span.id]
            points.append((span.end if not span.open else (at or span.end), step))  # training resumed here
    progress = status.get("progress") or {}
    last = facts.parse_time(progress.get("lastStepTime"))
    last_step = facts.as_int(progress.get("globalStep"))
    if last is not None and last_step is not None:
        points.append((last, last_step))
    ckpt = progress.get("lastCheckpoint") or {}
    checkpoints = []
    if (saved := facts.parse_time(ckpt.get("time"))) is not None and facts.as_int(ckpt.get("step")) is not None:
        checkpoints.append((saved, int(ckpt["step"])))
    gp = facts.goodput(status, now)
    goodput = f"goodput {gp.fraction:.1%}" if gp is not None and gp.fraction is not None else "not started"
    title = (f"{meta.get('namespace')}/{meta.get('name')}: {status.get('state') or '?'}, "
             f"{status.get('incidentCount') or 0} incident(s), {goodput}")
    return Timeline(title=title, points=sorted(points), spans=spans, checkpoints=checkpoints, series=sorted(series))


#: One colour per cause, so the same failure looks the same across reports.
COLOURS = {reasons.WORKER_FAILED: "tab:red", reasons.OOM_KILLED: "tab:purple", reasons.POD_DELETED: "tab:orange",
           reasons.POD_EVICTED: "tab:brown", reasons.NODE_LOST: "tab:pink", reasons.RENDEZVOUS_LOST: "tab:olive",
           reasons.STALLED: "tab:gray"}


def draw(tl: Timeline, path: Path) -> None:
    """The picture: steps over time (a straight line between the points the cluster knows), incidents shaded and
    labelled, checkpoints as triangles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    def x(at: datetime) -> float:  # matplotlib's date numbers (its stubs take floats)
        return float(mdates.date2num(at))  # type: ignore[no-untyped-call]

    fig, ax = plt.subplots(figsize=(10, 4.5), dpi=110)
    if tl.series:
        ax.plot([x(p[0]) for p in tl.series], [p[1] for p in tl.series], "-", color="tab:blue", linewidth=1.5,
                drawstyle="steps-post", label=f"global step (Prometheus, {len(tl.series)} samples)")
    if tl.points:
        ax.plot([x(p[0]) for p in tl.points], [p[1] for p in tl.points], ":o" if tl.series else "--o",
                color="tab:blue", markersize=5, alpha=0.6 if tl.series else 1.0,
                label="global step (the points the cluster keeps, joined)")
    seen: set[str] = set()
    for span in tl.spans:
        colour = COLOURS.get(span.cause, "tab:cyan")
        ax.axvspan(x(span.start), x(span.end), color=colour, alpha=0.25, hatch="//" if span.open else None,
                   label=span.cause if span.cause not in seen else None)
        seen.add(span.cause)
        ax.annotate(f"#{span.id}", (x(span.start), 1.0), xycoords=("data", "axes fraction"), fontsize=7,
                    ha="left", va="top", color="black")
    for at, step in tl.checkpoints:
        ax.plot([x(at)], [step], marker="v", color="tab:green", markersize=9, linestyle="none", label="last checkpoint")
    ax.set_title(tl.title, fontsize=10)
    ax.set_xlabel("time (UTC)")
    ax.set_ylabel("global step")
    # Concise: a job of seconds gets sub-second ticks without repeated labels, one of days gets dates.
    locator = mdates.AutoDateLocator()  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

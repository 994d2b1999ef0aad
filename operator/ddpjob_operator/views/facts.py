"""Facts derived from a DDPJob's status for people: how far it is, how much time failures cost, when it ends.
Pure: the caller passes the clock."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from ddpjob_operator.api import formats
from ddpjob_operator.planner import status as st

Obj = Mapping[str, Any]

#: States in which a job no longer trains: its clock stops at completionTime.
FINISHED = (st.SUCCEEDED, st.FAILED)


def parse_time(value: object) -> datetime | None:
    """formats.parse_time for whatever a status holds (workers write some of it): None if absent or garbled."""
    if not isinstance(value, str):
        return None
    try:
        parsed = formats.parse_time(value)
    except ValueError:
        return None
    return parsed if parsed is None or parsed.tzinfo else parsed.replace(tzinfo=UTC)


def duration(seconds: float | None) -> str:
    """Seconds as kubectl writes ages (``45s``, ``3m12s``, ``2h5m``, ``3d4h``); ``-`` for unknown."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{max(seconds, 0.0):.1f}s"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60}s" if s % 60 else f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60}m" if s % 3600 // 60 else f"{s // 3600}h"
    return f"{s // 86400}d{s % 86400 // 3600}h"


def since(value: object, now: datetime) -> float | None:
    """Seconds from an RFC 3339 time to ``now`` (None if absent)."""
    at = parse_time(value)
    return None if at is None else (now - at).total_seconds()


@dataclasses.dataclass(frozen=True)
class Goodput:
    """A job's wall time since its start and the part of it incidents cost (from each incident's start to the
    first training step after it; an incident still recovering counts up to now)."""

    elapsed: float
    lost: float

    @property
    def fraction(self) -> float | None:
        return None if self.elapsed <= 0 else max(0.0, 1.0 - self.lost / self.elapsed)


def incident_cost(incident: Obj, now: datetime) -> float:
    """Seconds an incident took from training: its recovery clock, or the time since it started while it lasts
    (a failed incident ends the job: its cost is counted up to the job's end by the caller's elapsed time)."""
    seconds = incident.get("recoverySeconds")
    if isinstance(seconds, int | float):
        return float(seconds)
    phases = incident.get("phases") or {}
    if isinstance(phases.get("firstStep"), int | float):
        return float(phases["firstStep"])
    start, end = parse_time(incident.get("startTime")), parse_time(incident.get("recoveredTime"))
    if start is None:
        return 0.0
    return max(0.0, ((end or now) - start).total_seconds())


def end_of(status: Obj, now: datetime) -> datetime:
    """Where a job's clock stops: its completionTime once it finished, else now."""
    end = parse_time(status.get("completionTime")) if status.get("state") in FINISHED else None
    return end or now


def goodput(status: Obj, now: datetime) -> Goodput | None:
    """None before the job started."""
    start = parse_time(status.get("startTime"))
    if start is None:
        return None
    stop = end_of(status, now)
    elapsed = max(0.0, (stop - start).total_seconds())
    lost = sum(incident_cost(i, stop) for i in status.get("incidents") or [])
    return Goodput(elapsed=elapsed, lost=min(lost, elapsed))


@dataclasses.dataclass(frozen=True)
class Progress:
    step: int | None
    total: int | None
    epoch: int | None
    rate: float | None
    last_step_age: float | None

    @property
    def fraction(self) -> float | None:
        if self.step is None or not self.total:
            return None
        return min(1.0, max(0.0, self.step / self.total))

    @property
    def eta(self) -> float | None:
        """Seconds to totalSteps at the last reported rate."""
        if self.step is None or not self.total or not self.rate or self.rate <= 0:
            return None
        return max(0, self.total - self.step) / self.rate


def as_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def progress(status: Obj, now: datetime) -> Progress:
    p = status.get("progress") or {}
    rate = p.get("stepRate")
    return Progress(step=as_int(p.get("globalStep")), total=as_int(p.get("totalSteps")), epoch=as_int(p.get("epoch")),
                    rate=float(rate) if isinstance(rate, int | float) else None,
                    last_step_age=since(p.get("lastStepTime"), now))


def bar(fraction: float | None, width: int = 20) -> str:
    """``[#########-----------]``; without a total, an empty bar that says so."""
    if fraction is None:
        return "[" + " " * width + "]"
    done = round(fraction * width)
    return "[" + "#" * done + "-" * (width - done) + "]"


def event_time(event: Obj) -> datetime | None:
    """When an Event last happened (core/v1 or events.k8s.io fields, whichever the poster set)."""
    for key in ("lastTimestamp", "eventTime", "firstTimestamp"):
        if (at := parse_time(event.get(key))) is not None:
            return at
    meta = event.get("metadata") or {}
    return parse_time(meta.get("creationTimestamp"))


#: The operator's loss Events name their incident ("...; incident #3 (NodeLost), 3 of backoffLimit 6").
_NAMED = re.compile(r"\bincident #(\d+)\b")


def owner_of(event: Obj, incidents: Sequence[Obj], now: datetime) -> int | None:
    """The id of the incident an Event belongs to: the one it names, else the one whose span (its start, up to
    its recovery, or the next incident's start while it lasts) holds the Event's time; None for an Event outside
    every incident."""
    named = _NAMED.search(str(event.get("message") or ""))
    ids = {as_int(i.get("id")) for i in incidents}
    if named and int(named.group(1)) in ids:
        return int(named.group(1))
    at = event_time(event)
    if at is None:
        return None
    spans: list[tuple[datetime, Obj]] = sorted(
        ((start, i) for i in incidents if (start := parse_time(i.get("startTime"))) is not None),
        key=lambda pair: pair[0])
    for k, (start, incident) in enumerate(spans):
        end = parse_time(incident.get("recoveredTime"))
        if end is None:
            end = spans[k + 1][0] if k + 1 < len(spans) else now
        # Kubernetes stamps Events to the second: an Event posted in the incident's first or last second belongs
        # to it.
        if start.replace(microsecond=0) <= at <= end + timedelta(seconds=1):
            return as_int(incident.get("id"))
    return None

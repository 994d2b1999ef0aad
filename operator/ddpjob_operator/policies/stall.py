"""Stall detection: a job whose training reports no progress for ``runPolicy.progressDeadlineSeconds``.

The clock starts at the latest sign of life: rank 0's last progress report (``status.progress.updateTime``), the
start of the newest incident (a recovery gets the whole deadline), the job's (re)start, or the newest worker
container start. Past the deadline the job is Stalled and the message says what it waits for, from what the
operator can see: pods that do not run (and why: the scheduler's or the kubelet's reason), workers that run but
never reported a step since they started (stuck in rendezvous or start-up: DNS, a peer that never joins), or
workers that reported steps and then fell silent (a hung rank; every other rank then waits in a collective).

``onStall`` acts only when every pod runs: restarting pods that wait for a node or an image would only start the
wait again, so pending pods are reported, never restarted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from ddpjob_operator.observed import PodView, format_time, parse_time

PODS_PENDING = "PodsPending"
NO_PROGRESS_SINCE_START = "NoProgressSinceStart"
PROGRESS_STOPPED = "ProgressStopped"


@dataclasses.dataclass(frozen=True, slots=True)
class Stall:
    """A stalled job: why, in words, and whether ``onStall`` applies."""

    reason: str
    message: str
    actionable: bool


def _latest(*times: datetime | None) -> datetime | None:
    present = [t for t in times if t is not None]
    return max(present) if present else None


def clock_start(status: Mapping[str, Any], workers: Sequence[PodView]) -> datetime | None:
    """The latest sign of life the deadline counts from."""
    progress = status.get("progress") or {}
    incidents = status.get("incidents") or []
    last_incident = parse_time(incidents[-1].get("startTime")) if incidents else None
    started = [p.started_at for p in workers if p.started_at is not None]
    return _latest(parse_time(progress.get("updateTime")), last_incident, parse_time(status.get("startTime")),
                   max(started) if started else None)


def _pending_text(pods: Sequence[PodView]) -> str:
    shown = [f"{p.name} ({p.waiting or p.phase})" for p in pods[:3]]
    more = f" and {len(pods) - 3} more" if len(pods) > 3 else ""
    return ", ".join(shown) + more


def check(
    status: Mapping[str, Any],
    workers: Sequence[PodView],
    rendezvous: Sequence[PodView],
    replicas: int,
    deadline_seconds: int,
    now: datetime,
) -> tuple[Stall | None, datetime | None]:
    """(the stall, or None) and when to look again. ``workers`` are the job's live worker pods."""
    if deadline_seconds <= 0:
        return None, None
    start = clock_start(status, workers)
    if start is None:
        return None, None
    due = start + timedelta(seconds=deadline_seconds)
    if now < due:
        return None, due
    silent = f"no progress for {int((now - start).total_seconds())}s (progressDeadlineSeconds {deadline_seconds})"
    not_running = [p for p in [*rendezvous, *workers] if not p.running]
    if not_running or len(workers) < replicas or not rendezvous:
        missing = replicas - len(workers)
        what = _pending_text(not_running) if not_running else ""
        if missing > 0:
            what = (what + "; " if what else "") + f"{missing} worker pod(s) not created yet"
        if not rendezvous:
            what = (what + "; " if what else "") + "the rendezvous pod is not created yet"
        return Stall(PODS_PENDING, f"{silent}: waiting for pods to run: {what}", False), None
    progress = status.get("progress") or {}
    reported = parse_time(progress.get("updateTime"))
    group_start = _latest(*(p.started_at for p in workers))
    if reported is None or (group_start is not None and reported < group_start):
        since = format_time(group_start) if group_start else "their start"
        msg = (f"{silent}: all {len(workers)} workers run but none reported a training step since {since}: "
               "stuck before training (rendezvous, DNS of the rendezvous host, or start-up); see the workers' logs")
        return Stall(NO_PROGRESS_SINCE_START, msg, True), None
    msg = (f"{silent}: training reported global step {progress.get('globalStep')} at {progress.get('updateTime')} "
           "and nothing since: a silent rank (a hung process holds every other rank in a collective)")
    return Stall(PROGRESS_STOPPED, msg, True), None

"""Stall detection: a job whose training does no step within its deadlines.

Two clocks, both from the current process group's start: the latest of the job's (re)start, the newest incident's
start, the newest worker container start and the rendezvous time rank 0 announces when a new group starts (an
in-place restart after kill -9 starts a group without a new pod). Until the group's first step the start-up
allowance applies (``startupDeadlineSeconds``: imports, rendezvous, data and model loading); from its first step
on, ``progressDeadlineSeconds`` between two steps. A step is what rank 0 reports: the script's own
ProgressReporter, or the optimizer steps the worker runtime counts in any Python script (``status.progress``,
``lastStepTime``). The runtime cannot count the steps of a command it does not run in-process (a binary, a shell
script): such a job's running workers are judged only once it reports a step some other way.

Once rank 0's script has returned (``status.progress.finishTime``, written by the runtime as the script returns
normally) no step is due any more: the workers' exit (interpreter teardown, torchrun's exit barrier, where rank 0
waits for every other node, the kubelet's report) gets the larger of the two deadlines, and a job still not done
after it is reported (``NotExiting``), never restarted: restarting the group would train a finished run again.

Past a deadline the job is Stalled and the message says what the operator knows: pods that do not run (and why:
the scheduler's or the kubelet's reason), workers that run but did no step since the group started (stuck in
start-up), or training that stopped after step N. ``onStall`` acts only when every pod runs: restarting pods that
wait for a node or an image would only start the wait again, so pending pods are reported, never restarted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from ddpjob_operator.api.formats import format_time, parse_time
from ddpjob_operator.api.reasons import (
    FINISHING,
    NO_PROGRESS_SINCE_START,
    NOT_EXITING,
    PODS_PENDING,
    PROGRESS_STOPPED,
    PROGRESSING,
    STALL_DETECTION_OFF,
    STARTING_UP,
    STEPS_NOT_VISIBLE,
)
from ddpjob_operator.planner.observation import PodView

# The Stalled condition's reasons (True: a Stall's; False: a Verdict's, what the operator is waiting for) are in
# api/reasons.py.


@dataclasses.dataclass(frozen=True, slots=True)
class Stall:
    """A stalled job: why, in words, and whether ``onStall`` applies."""

    reason: str
    message: str
    actionable: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Deadlines:
    """The run policy's two deadlines, in seconds (0: that phase is never judged)."""

    progress: int
    """Between two steps (``progressDeadlineSeconds``; 0 turns all stall detection off)."""
    startup: int
    """From the group's start to its first step (``startupDeadlineSeconds``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """The stall check's answer: the stall (or None), when to look again, and while not stalled the Stalled
    condition's reason and message."""

    stall: Stall | None
    due: datetime | None
    reason: str = PROGRESSING
    message: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Clock:
    """Where the current process group stands."""

    group_start: datetime | None
    """The latest of the job's start, the newest incident, the newest worker start and rank 0's rendezvous."""
    last_step: datetime | None
    """The last step reported since ``group_start``; None while the group did none."""
    step: Any = None
    """``globalStep`` of that report."""
    source: str | None = None
    """Who counted it (``status.progress.source``)."""
    finished: datetime | None = None
    """When rank 0's script of this group returned normally (``status.progress.finishTime``); None before."""


def _latest(*times: datetime | None) -> datetime | None:
    present = [t for t in times if t is not None]
    return max(present) if present else None


def read_clock(status: Mapping[str, Any], workers: Sequence[PodView]) -> Clock:
    """The group's start and its last step, from the status and the worker pods."""
    progress = status.get("progress") or {}
    start = progress.get("start")
    start = start if isinstance(start, Mapping) else {}
    incidents = status.get("incidents") or []
    group = _latest(parse_time(status.get("startTime")),
                    parse_time(incidents[-1].get("startTime")) if incidents else None,
                    *(p.started_at for p in workers), parse_time(start.get("rendezvousTime")))
    last = parse_time(progress.get("lastStepTime")) or parse_time(progress.get("updateTime"))
    if last is not None and group is not None and last < group:
        last = None  # a step of an earlier group
    finished = parse_time(progress.get("finishTime"))
    if finished is not None and group is not None and finished < group:
        finished = None  # an earlier group's end: this one was started after it
    return Clock(group, last, progress.get("globalStep"), progress.get("source"), finished)


def _pending_text(pods: Sequence[PodView]) -> str:
    shown = [f"{p.name} ({p.waiting or p.phase})" for p in pods[:3]]
    more = f" and {len(pods) - 3} more" if len(pods) > 3 else ""
    return ", ".join(shown) + more


def _pending(workers: Sequence[PodView], rendezvous: Sequence[PodView], replicas: int) -> str:
    """What does not run yet, in words ("" when every pod runs)."""
    parts = []
    not_running = [p for p in [*rendezvous, *workers] if not p.running]
    if not_running:
        parts.append(_pending_text(not_running))
    if len(workers) < replicas:
        parts.append(f"{replicas - len(workers)} worker pod(s) not created yet")
    if not rendezvous:
        parts.append("the rendezvous pod is not created yet")
    return "; ".join(parts)


def _source_words(source: str | None) -> str:
    if source == "OptimizerSteps":
        return "optimizer steps counted by the worker runtime"
    return "reported by the script" if source == "Reporter" else "reported by rank 0"


def _stepping(clock: Clock, limit: int, waiting: str, now: datetime) -> Verdict:
    """The group did a step: ``limit`` seconds until the next."""
    assert clock.last_step is not None
    due = clock.last_step + timedelta(seconds=limit)
    if now < due:
        return Verdict(None, due, PROGRESSING, f"training reports steps ({_source_words(clock.source)}); Stalled "
                                               f"after progressDeadlineSeconds ({limit}s) without one")
    silent = (f"no step for {int((now - clock.last_step).total_seconds())}s (progressDeadlineSeconds {limit}) "
              f"since step {clock.step} at {format_time(clock.last_step)}")
    msg = (f"training stopped after step {clock.step} ({_source_words(clock.source)}) at "
           f"{format_time(clock.last_step)}: no step for {int((now - clock.last_step).total_seconds())}s "
           f"(progressDeadlineSeconds {limit}): a silent rank (a hung process holds every other rank in a "
           "collective); see the workers' logs")
    return _past_due(silent, waiting, PROGRESS_STOPPED, msg)


def _starting(clock: Clock, limit: int, waiting: str, visible: bool, now: datetime) -> Verdict:
    """The group did no step yet: the start-up allowance."""
    assert clock.group_start is not None
    since = format_time(clock.group_start)
    if not visible and not waiting:
        return Verdict(None, None, STEPS_NOT_VISIBLE, (
            "the worker command is not a Python script that the worker runtime runs, so it cannot count its "
            "steps: running workers are judged only after the script reports one (ProgressReporter); run the "
            "script with python, or see docs/api.md, \"Stall detection\""))
    if limit <= 0:
        return Verdict(None, None, STARTING_UP, f"no step reported since the group started at {since}; "
                                                "startupDeadlineSeconds is 0: start-up is never judged")
    due = clock.group_start + timedelta(seconds=limit)
    if now < due:
        return Verdict(None, due, STARTING_UP, f"no step reported since the group started at {since}; allowed until "
                                               f"{format_time(due)} (startupDeadlineSeconds {limit})")
    silent = (f"no step since the group started at {since}: {int((now - clock.group_start).total_seconds())}s, "
              f"past the start-up allowance (startupDeadlineSeconds {limit})")
    msg = (f"{silent}: every worker runs, stuck in start-up (rendezvous, DNS of the rendezvous host, loading data "
           "or a model; a script that steps no torch.optim optimizer must report with ProgressReporter); see the "
           "workers' logs")
    return _past_due(silent, waiting, NO_PROGRESS_SINCE_START, msg)


def _finishing(clock: Clock, deadlines: Deadlines, now: datetime) -> Verdict:
    """Rank 0's script returned: what is left is the workers' exit, allowed the larger of the two deadlines (a
    rank still writing its final checkpoint holds rank 0 at torchrun's exit barrier, as long as a start-up or a
    step may take). Past it the job is reported, not restarted: the training it would repeat is done."""
    assert clock.finished is not None
    limit = max(deadlines.progress, deadlines.startup)
    since = format_time(clock.finished)
    due = clock.finished + timedelta(seconds=limit)
    if now < due:
        return Verdict(None, due, FINISHING, f"rank 0's script returned at {since}: waiting for the workers to exit; "
                                             f"allowed until {format_time(due)} (the larger of "
                                             "progressDeadlineSeconds and startupDeadlineSeconds)")
    msg = (f"rank 0's script returned at {since}, but the workers have not all exited for "
           f"{int((now - clock.finished).total_seconds())}s (allowed {limit}s, the larger of progressDeadlineSeconds "
           "and startupDeadlineSeconds): a rank whose script has not returned holds the others at torchrun's exit "
           "barrier; not restarted, since the training is done; see the workers' logs")
    return Verdict(Stall(NOT_EXITING, msg, False), None)


def _past_due(silent: str, waiting: str, reason: str, msg: str) -> Verdict:
    """A deadline passed: a stall ``onStall`` applies to when every pod runs; while some still wait to run, one
    that only says so (restarting the group would not make them run)."""
    if waiting:
        return Verdict(Stall(PODS_PENDING, f"{silent}: waiting for pods to run: {waiting}", False), None)
    return Verdict(Stall(reason, msg, True), None)


def check(status: Mapping[str, Any], workers: Sequence[PodView], rendezvous: Sequence[PodView], replicas: int,
          deadlines: Deadlines, now: datetime, *, visible: bool = True) -> Verdict:
    """The stall check of one pass. ``workers`` are the job's live worker pods; ``visible``: the worker runtime
    can count the command's steps (contract.python_target)."""
    if deadlines.progress <= 0:
        return Verdict(None, None, STALL_DETECTION_OFF,
                       "runPolicy.progressDeadlineSeconds is 0: stall detection is off")
    clock = read_clock(status, workers)
    if clock.group_start is None:
        return Verdict(None, None, STARTING_UP, "the job has not started")
    if clock.finished is not None:
        return _finishing(clock, deadlines, now)
    waiting = _pending(workers, rendezvous, replicas)
    if clock.last_step is not None:
        return _stepping(clock, deadlines.progress, waiting, now)
    return _starting(clock, deadlines.startup, waiting, visible, now)

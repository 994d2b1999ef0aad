"""Table tests of the stall clocks (policies/stall.py): the start-up allowance until a group's first step, the
between-steps deadline after it, what starts a group, and the words of each verdict."""

from __future__ import annotations

from typing import Any

import pytest
from ddpjob_operator.api.formats import format_time
from ddpjob_operator.planner.observation import PodView
from ddpjob_operator.planner.policies import stall

from .factories import at

pytestmark = pytest.mark.unit

#: progressDeadlineSeconds 60, startupDeadlineSeconds 300.
DEADLINES = stall.Deadlines(progress=60, startup=300)


def worker(i: int, **kw: Any) -> PodView:
    base: dict[str, Any] = {"name": f"j-worker-{i}", "uid": f"w{i}", "replica_type": "worker", "index": i,
                            "phase": "Running", "started_at": at(0)}
    return PodView(**{**base, **kw})


RDZV = PodView(name="j-rdzv", uid="r", replica_type="rendezvous", phase="Running")
TWO = [worker(0), worker(1)]


def ms(seconds: float) -> str:
    """A time with milliseconds, as rank 0 writes lastStepTime and the start record."""
    return at(seconds).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def status(step_at: float | None = None, *, source: str = "OptimizerSteps", rendezvous: float | None = None,
           finish: float | None = None, old_format: bool = False, **extra: Any) -> dict[str, Any]:
    """A job started at 0 whose rank 0 reported step 42 at ``step_at`` (None: no step reported)."""
    out: dict[str, Any] = {"startTime": format_time(at(0)), **extra}
    progress: dict[str, Any] = {}
    if step_at is not None:
        progress = {"globalStep": 42, "updateTime": format_time(at(step_at))}
        if not old_format:  # an older worker wrote updateTime only
            progress.update(lastStepTime=ms(step_at), source=source)
    if rendezvous is not None:
        progress["start"] = {"restartCount": 1, "rendezvousTime": ms(rendezvous)}
    if finish is not None:
        progress["finishTime"] = ms(finish)
    if progress:
        out["progress"] = progress
    return out


PENDING = worker(1, phase="Pending", started_at=None, waiting="Unschedulable: 0/3 nodes are available")


@pytest.mark.parametrize(
    ("name", "st", "workers", "now", "visible", "reason", "due"),
    [
        # Start-up: from the group's start until its first step, startupDeadlineSeconds (300) applies.
        ("start-up within the allowance, past the step deadline", status(), TWO, 200, True, "StartingUp", 300),
        ("start-up past the allowance", status(), TWO, 301, True, "NoProgressSinceStart", None),
        ("a replaced worker restarts the start-up clock", status(), [worker(0), worker(1, started_at=at(100))], 350,
         True, "StartingUp", 400),
        ("an incident restarts the start-up clock", status(incidents=[{"startTime": format_time(at(50))}]), TWO,
         340, True, "StartingUp", 350),
        ("an in-place restart (a new rendezvous) restarts it too", status(30, rendezvous=40), TWO, 320, True,
         "StartingUp", 340),
        ("pods that wait past the allowance are reported, not restarted", status(), [worker(0), PENDING], 301,
         True, "PodsPending", None),
        # Between steps: from the group's first step on, progressDeadlineSeconds (60).
        ("steps within the deadline", status(250), TWO, 300, True, "Progressing", 310),
        ("a silent rank after steps", status(10), TWO, 71, True, "ProgressStopped", None),
        ("the first step ends the start-up: the step deadline runs from it", status(5), TWO, 66, True,
         "ProgressStopped", None),
        ("a step of the group before the restart does not count", status(30, rendezvous=40), TWO, 341, True,
         "NoProgressSinceStart", None),
        ("a step of this group after an in-place restart", status(45, rendezvous=40), TWO, 100, True,
         "Progressing", 105),
        ("an older worker's report (updateTime only) is a step", status(10, old_format=True), TWO, 71, True,
         "ProgressStopped", None),
        ("a lost worker after steps: reported, not restarted", status(10), [worker(0), PENDING], 71, True,
         "PodsPending", None),
        # Rank 0's script returned: the workers' exit gets the larger deadline (300), reported past it, not restarted.
        ("a finished script's workers exiting slowly are no stall", status(10, finish=11), TWO, 200, True,
         "Finishing", 311),
        ("a finish holds even with a worker already gone", status(10, finish=11), [worker(0)], 200, True,
         "Finishing", 311),
        ("workers that never exit after the finish are reported", status(10, finish=11), TWO, 312, True,
         "NotExiting", None),
        ("an earlier group's finish does not count", status(30, rendezvous=40, finish=35), TWO, 341, True,
         "NoProgressSinceStart", None),
        # A command the runtime does not run in-process: running workers are judged only after a step.
        ("steps not visible: running workers are never judged at start-up", status(), TWO, 5000, False,
         "StepsNotVisible", None),
        ("steps not visible, but pods that never run are reported", status(), [worker(0), PENDING], 301, False,
         "PodsPending", None),
        ("steps not visible, but it reports steps: the step deadline applies", status(10, source="Reporter"), TWO,
         71, False, "ProgressStopped", None),
    ],
)
def test_stall_clocks(name: str, st: dict[str, Any], workers: list[PodView], now: float, visible: bool, reason: str,
                      due: float | None) -> None:
    verdict = stall.check(st, workers, [RDZV], 2, DEADLINES, at(now), visible=visible)
    found = verdict.stall.reason if verdict.stall else verdict.reason
    assert found == reason, f"{name}: {verdict}"
    assert verdict.due == (at(due) if due is not None else None), name
    if verdict.stall is not None:
        assert verdict.stall.actionable is (reason not in ("PodsPending", "NotExiting")), name


def test_progress_deadline_zero_turns_detection_off() -> None:
    verdict = stall.check(status(), TWO, [RDZV], 2, stall.Deadlines(progress=0, startup=300), at(10_000))
    assert verdict == stall.Verdict(None, None, "StallDetectionOff",
                                    "runPolicy.progressDeadlineSeconds is 0: stall detection is off")


def test_startup_deadline_zero_never_judges_start_up() -> None:
    verdict = stall.check(status(), TWO, [RDZV], 2, stall.Deadlines(progress=60, startup=0), at(10_000))
    assert verdict.stall is None and verdict.due is None and verdict.reason == "StartingUp"
    assert "startupDeadlineSeconds is 0" in verdict.message


@pytest.mark.parametrize(
    ("source", "words"),
    [("OptimizerSteps", "optimizer steps counted by the worker runtime"), ("Reporter", "reported by the script"),
     (None, "reported by rank 0")],
)
def test_a_silent_rank_says_the_step_it_stopped_after_and_who_counted_it(source: str | None, words: str) -> None:
    st = status(10, source=source or "")
    if source is None:
        del st["progress"]["source"]
    found = stall.check(st, TWO, [RDZV], 2, DEADLINES, at(80)).stall
    assert found is not None and found.reason == "ProgressStopped"
    assert found.message.startswith(f"training stopped after step 42 ({words}) at 2026-01-01T12:00:10Z: "
                                    "no step for 70s (progressDeadlineSeconds 60)"), found.message


def test_start_up_stall_names_the_start_up_and_its_allowance() -> None:
    found = stall.check(status(), TWO, [RDZV], 2, DEADLINES, at(301)).stall
    assert found is not None
    assert found.message.startswith("no step since the group started at 2026-01-01T12:00:00Z: 301s, past the "
                                    "start-up allowance (startupDeadlineSeconds 300): every worker runs, stuck in "
                                    "start-up"), found.message


def test_the_words_while_not_stalled_are_what_the_operator_knows() -> None:
    starting = stall.check(status(), TWO, [RDZV], 2, DEADLINES, at(10))
    assert starting.message == ("no step reported since the group started at 2026-01-01T12:00:00Z; allowed until "
                                "2026-01-01T12:05:00Z (startupDeadlineSeconds 300)")
    stepping = stall.check(status(5, source="Reporter"), TWO, [RDZV], 2, DEADLINES, at(10))
    assert stepping.message == ("training reports steps (reported by the script); Stalled after "
                                "progressDeadlineSeconds (60s) without one")


def test_pending_stall_names_the_pod_and_the_schedulers_reason() -> None:
    found = stall.check(status(), [worker(0), PENDING], [RDZV], 2, DEADLINES, at(400)).stall
    assert found is not None and "j-worker-1 (Unschedulable: 0/3 nodes are available)" in found.message
    missing = stall.check(status(), [worker(0)], [], 2, DEADLINES, at(400)).stall
    assert missing is not None and missing.reason == "PodsPending"
    assert "1 worker pod(s) not created yet; the rendezvous pod is not created yet" in missing.message


def test_a_finish_says_when_the_script_returned_and_why_nothing_is_restarted() -> None:
    waiting = stall.check(status(10, finish=11), TWO, [RDZV], 2, DEADLINES, at(20))
    assert waiting.message == ("rank 0's script returned at 2026-01-01T12:00:11Z: waiting for the workers to exit; "
                               "allowed until 2026-01-01T12:05:11Z (the larger of progressDeadlineSeconds and "
                               "startupDeadlineSeconds)")
    found = stall.check(status(10, finish=11), TWO, [RDZV], 2, DEADLINES, at(400)).stall
    assert found is not None
    assert found.message.startswith("rank 0's script returned at 2026-01-01T12:00:11Z, but the workers have not all "
                                    "exited for 389s (allowed 300s"), found.message
    assert "not restarted, since the training is done" in found.message

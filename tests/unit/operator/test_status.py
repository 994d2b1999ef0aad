"""Status: conditions per the API conventions, minimal patches, transition events."""

from __future__ import annotations

from typing import Any

from ddpjob_operator.planner import status as st

from .factories import at


def compute(old: dict[str, Any], state: str, reason: str = "R", now_s: float = 0, **counts: Any) -> dict[str, Any]:
    c = st.Counts(desired=2, restarts=counts.pop("restarts", 0), **counts)
    return st.compute_status(
        old,
        outcome=st.Outcome(state=state, reason=reason, message="m"),
        workers=[],
        counts=c,
        generation=3,
        now=at(now_s),
    )


def test_condition_fields_follow_api_conventions() -> None:
    new = compute({}, st.RUNNING, "AllWorkersRunning")
    running = st.get_condition(new, st.RUNNING)
    assert running == {
        "type": "Running",
        "status": "True",
        "reason": "AllWorkersRunning",
        "message": "m",
        "lastTransitionTime": "2026-01-01T12:00:00Z",
        "observedGeneration": 3,
    }
    assert new["observedGeneration"] == 3 and new["state"] == "Running"


def test_last_transition_time_moves_only_on_flips() -> None:
    first = compute({}, st.RUNNING)
    same = compute(first, st.RUNNING, now_s=60)
    assert st.get_condition(same, st.RUNNING) == st.get_condition(first, st.RUNNING)
    flipped = compute(same, st.RESTARTING, "WorkerFailed", now_s=120)
    running = st.get_condition(flipped, st.RUNNING)
    assert running is not None and running["status"] == "False"
    assert running["lastTransitionTime"] == "2026-01-01T12:02:00Z"


def test_absent_conditions_stay_absent() -> None:
    new = compute({}, st.CREATED, "WorkersStarting")
    assert {c["type"] for c in new["conditions"]} == {"Created", "Running"}


def test_suspend_then_resume() -> None:
    suspended = compute(compute({}, st.RUNNING), st.SUSPENDED, "Suspended")
    assert st.condition_true(suspended, st.SUSPENDED) and not st.condition_true(suspended, st.RUNNING)
    resumed = compute(suspended, st.CREATED, "WorkersStarting")
    cond = st.get_condition(resumed, st.SUSPENDED)
    assert cond is not None and cond["status"] == "False" and cond["reason"] == "Resumed"


def test_patch_contains_only_changed_keys_and_never_progress() -> None:
    old = {**compute({}, st.RUNNING), "progress": {"epoch": 3}}
    assert st.status_patch(old, compute(old, st.RUNNING)) == {}
    patch = st.status_patch(old, compute(old, st.RUNNING, restarts=1))
    assert patch == {"restarts": 1}
    assert "progress" not in st.OWN_KEYS


def test_removed_keys_become_null_in_the_patch() -> None:
    old = compute({}, st.RUNNING, start_time="2026-01-01T12:00:00Z")
    assert st.status_patch(old, compute(old, st.SUSPENDED))["startTime"] is None


def test_transition_events() -> None:
    old = compute({}, st.RUNNING)
    events = st.transition_events(old, compute(old, st.FAILED, "PermanentExitCode"))
    assert [(e.type, e.reason) for e in events] == [("Warning", "PermanentExitCode")]
    assert st.transition_events(old, compute(old, st.RUNNING)) == []

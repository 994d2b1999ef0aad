"""What `kubectl ddpjob` derives from a status: durations, goodput, progress and ETA, which incident an Event
belongs to."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from ddpjob_operator.views import facts

NOW = datetime(2026, 11, 27, 12, 10, 0, tzinfo=UTC)


@pytest.mark.parametrize(("seconds", "text"), [
    (None, "-"), (0.04, "0.0s"), (9.96, "10.0s"), (12.7, "12s"), (60, "1m"), (192, "3m12s"), (3600, "1h"),
    (7500, "2h5m"), (97200, "1d3h"), (-3, "0.0s"),
])
def test_durations_read_like_kubectl_ages(seconds: float | None, text: str) -> None:
    assert facts.duration(seconds) == text


@pytest.mark.parametrize(("value", "expected"), [
    ("2026-11-27T12:00:00Z", datetime(2026, 11, 27, 12, 0, tzinfo=UTC)),
    ("2026-11-27T12:00:00.250Z", datetime(2026, 11, 27, 12, 0, 0, 250000, tzinfo=UTC)),
    ("2026-11-27T13:00:00+01:00", datetime(2026, 11, 27, 12, 0, tzinfo=UTC)),
    ("yesterday", None), (None, None), (12, None), ("", None),
])
def test_times_from_the_status(value: object, expected: datetime | None) -> None:
    assert facts.parse_time(value) == expected


def _status(**kw: Any) -> dict[str, Any]:
    return {"startTime": "2026-11-27T12:00:00Z", "state": "Running", **kw}


@pytest.mark.parametrize(("status", "elapsed", "lost"), [
    ({}, None, None),  # not started
    (_status(), 600, 0),
    (_status(incidents=[{"id": 1, "recoverySeconds": 6.0}, {"id": 2, "phases": {"firstStep": 4.0}}]), 600, 10),
    # still recovering: counts up to now
    (_status(incidents=[{"id": 1, "startTime": "2026-11-27T12:09:30Z", "outcome": "Recovering"}]), 600, 30),
    # finished: the clock stops at completionTime, a failed incident counts up to it
    (_status(state="Failed", completionTime="2026-11-27T12:05:00Z",
             incidents=[{"id": 1, "startTime": "2026-11-27T12:04:00Z", "outcome": "Failed"}]), 300, 60),
    # never more lost than elapsed
    (_status(incidents=[{"id": 1, "recoverySeconds": 9000}]), 600, 600),
])
def test_goodput_is_the_share_of_the_jobs_time_no_incident_took(status: dict[str, Any], elapsed: float | None,
                                                                lost: float | None) -> None:
    gp = facts.goodput(status, NOW)
    if elapsed is None:
        assert gp is None
        return
    assert gp is not None and lost is not None and (gp.elapsed, gp.lost) == (elapsed, lost)
    assert gp.fraction == pytest.approx(1 - lost / elapsed)


@pytest.mark.parametrize(("progress", "fraction", "eta"), [
    ({}, None, None),
    ({"globalStep": 40}, None, None),  # no total: no bar, no ETA
    ({"globalStep": 40, "totalSteps": 100}, 0.4, None),  # no rate yet
    ({"globalStep": 40, "totalSteps": 100, "stepRate": 2.0}, 0.4, 30.0),
    ({"globalStep": 120, "totalSteps": 100, "stepRate": 2.0}, 1.0, 0.0),
    ({"globalStep": 40, "totalSteps": 100, "stepRate": 0}, 0.4, None),
    ({"globalStep": True, "totalSteps": 100}, None, None),  # a bool is no step
])
def test_progress_and_eta(progress: dict[str, Any], fraction: float | None, eta: float | None) -> None:
    p = facts.progress({"progress": progress}, NOW)
    assert (p.fraction, p.eta) == (fraction, eta)


@pytest.mark.parametrize(("fraction", "text"), [(None, "[    ]"), (0.0, "[----]"), (0.5, "[##--]"), (1.0, "[####]")])
def test_bar(fraction: float | None, text: str) -> None:
    assert facts.bar(fraction, width=4) == text


INCIDENTS = [
    {"id": 1, "startTime": "2026-11-27T12:01:00.400Z", "recoveredTime": "2026-11-27T12:01:06.200Z"},
    {"id": 2, "startTime": "2026-11-27T12:05:00Z"},  # still recovering
]


@pytest.mark.parametrize(("at", "owner"), [
    ("2026-11-27T12:00:59Z", None),
    ("2026-11-27T12:01:00Z", 1),  # Events are stamped to the second: the incident's first second is its own
    ("2026-11-27T12:01:07Z", 1),  # ... and so is its last
    ("2026-11-27T12:01:08Z", None),
    ("2026-11-27T12:05:00Z", 2),
    ("2026-11-27T12:09:59Z", 2),  # open until now
])
def test_an_event_belongs_to_the_incident_whose_span_holds_it(at: str, owner: int | None) -> None:
    assert facts.owner_of({"lastTimestamp": at}, INCIDENTS, NOW) == owner


def test_an_event_that_names_its_incident_belongs_to_it_whenever_it_was_posted() -> None:
    late = {"lastTimestamp": "2026-11-27T12:03:00Z", "message": "replaced worker 1 (exit code 1); incident #1 (x)"}
    assert facts.owner_of(late, INCIDENTS, NOW) == 1
    unknown = {"lastTimestamp": "2026-11-27T12:03:00Z", "message": "incident #7 (x)"}  # no longer kept: by time
    assert facts.owner_of(unknown, INCIDENTS, NOW) is None


def test_event_times_from_either_api() -> None:
    assert facts.event_time({"eventTime": "2026-11-27T12:00:01.5Z"}) == datetime(2026, 11, 27, 12, 0, 1, 500000,
                                                                                 tzinfo=UTC)
    assert facts.event_time({"metadata": {"creationTimestamp": "2026-11-27T12:00:02Z"}}) == \
        datetime(2026, 11, 27, 12, 0, 2, tzinfo=UTC)
    assert facts.event_time({}) is None

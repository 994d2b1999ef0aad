"""What workers write can never stop a pass (issue 43): status.progress times are read leniently
(api/formats.parse_time), one that cannot be read is ignored and said once per job (policies/unreadable.py)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from ddpjob_operator.api.formats import format_time, parse_time
from ddpjob_operator.metrics import jobstats
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.plan import plan
from ddpjob_operator.planner.policies import unreadable

from .factories import at, running_cluster

T = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(("value", "expected"), [
    ("2026-01-01T00:00:00Z", T),
    # What the API server's format: date-time accepts besides the canonical form (each checked against
    # kube-apiserver 1.34, which refuses 2026-02-31, an hour 24, a second 60, no zone, a space for the T).
    ("2026-01-01t00:00:00z", T),
    ("2026-01-01T00:00:00.25z", T + timedelta(milliseconds=250)),
    ("2026-01-01T00:00:00.123456789Z", T + timedelta(microseconds=123456)),  # nanoseconds: cut to microseconds
    ("2026-01-01T00:00:00,5Z", T + timedelta(milliseconds=500)),  # any one character before the fraction
    ("2026-01-01T01:00:00+01:00", T),
    ("2026-01-01T00:00:00ZTwhatever", T),  # the validator ignores what follows a second t
    ("2026-01-01T00:00:00", T),  # no zone: UTC
    ("2026-01-01 00:00:00Z", T),
    ("2025-12-31T23:59:60Z", T - timedelta(seconds=1)),  # a leap second: the minute's last second
    ("2026-01-01T00:00:00-00:00", T), ("2026-01-01T00:00:00+14:00", T - timedelta(hours=14)),
    # What no clock reads (the API server accepts the offsets of 24 hours or more): ignored like an absent value.
    ("2026-01-01T00:00:00+99:00", None), ("2026-01-01T00:00:00+24:00", None),
    ("2026-02-31T00:00:00Z", None), ("2026-01-01T24:00:00Z", None),
    ("yesterday", None), ("", None), (None, None), (17, None), ({"a": 1}, None),
])
def test_times_are_read_leniently_and_never_raise(value: object, expected: datetime | None) -> None:
    got = parse_time(value)
    assert got == expected
    assert got is None or got.tzinfo is not None, "always aware: compared with the operator's clock"


def test_an_offset_is_kept_and_formats_as_utc() -> None:
    got = parse_time("2026-01-01T05:30:00+05:30")
    assert got is not None and got.utcoffset() == timedelta(hours=5, minutes=30) and got.tzinfo != UTC
    assert format_time(got) == "2026-01-01T00:00:00Z"


@pytest.mark.parametrize(("progress", "expected"), [
    (None, {}),
    ({"lastStepTime": "2026-01-01t00:00:00z", "updateTime": "2026-01-01T00:00:00Z"}, {}),
    ({"lastStepTime": "2026-01-01T00:00:00+99:00", "start": {"firstStepTime": "soon"}, "finishTime": ""},
     {"status.progress.lastStepTime": "2026-01-01T00:00:00+99:00", "status.progress.start.firstStepTime": "soon"}),
    ({"lastCheckpoint": {"time": "x", "step": 3}, "lostPeers": {"w-1": {"silentSince": "y", "reportTime": None}}},
     {"status.progress.lastCheckpoint.time": "x", "status.progress.lostPeers.w-1.silentSince": "y"}),
    ({"start": "not an object", "lostPeers": ["nor this"]}, {}),
])
def test_unreadable_times(progress: Any, expected: dict[str, str]) -> None:
    assert unreadable.times(progress) == expected


@pytest.mark.parametrize("value", ["2026-01-01t12:00:01z", "2026-01-01T12:00:01.123456789+00:00"])
def test_a_time_the_api_server_accepts_never_stops_the_planner(value: str) -> None:
    c = running_cluster()
    c.jobobj["status"]["progress"] = {"globalStep": 10, "lastStepTime": value, "updateTime": value,
                                      "start": {"rendezvousTime": value, "firstStepTime": value}}
    p = c.step(at(2))
    assert c.status["state"] == st.RUNNING and p.unreadable == {}
    stalled = st.get_condition(c.status, st.STALLED)
    assert stalled is not None and stalled["reason"] == "Progressing", "the step was read"


def test_an_unreadable_time_is_ignored_and_said_once() -> None:
    c = running_cluster()
    c.jobobj["status"]["progress"] = {"globalStep": 10, "lastStepTime": "2026-01-01T00:00:00+99:00"}
    p = plan(c.jobobj, c.observed(), at(2))
    assert list(p.unreadable) == ["status.progress.lastStepTime"]
    said = [e for e in p.events if e.reason == "ProgressUnreadable"]
    assert len(said) == 1 and said[0].type == "Warning" and "2026-01-01T00:00:00+99:00" in said[0].message
    again = plan(c.jobobj, dataclasses.replace(c.observed(), unreadable_said=frozenset(p.unreadable)), at(3))
    assert again.unreadable == {} and not [e for e in again.events if e.reason == "ProgressUnreadable"]


def test_the_metrics_scrape_reads_a_worker_written_time_leniently() -> None:
    progress = {"lastCheckpoint": {"time": "2026-01-01t00:00:00z"}}
    body: dict[str, Any] = {"metadata": {"namespace": "ml", "name": "a"},
                            "status": {"state": "Running", "progress": progress}}
    now = T + timedelta(seconds=90)
    assert jobstats.collect([body], now).max_checkpoint_age == 90.0
    body["status"]["progress"]["lastCheckpoint"]["time"] = "2026-01-01T00:00:00+24:00"
    assert jobstats.collect([body], now).max_checkpoint_age == 0.0

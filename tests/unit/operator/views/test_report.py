"""The timeline `kubectl ddpjob report` draws: points from the status and the recovery Events, incident spans."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from ddpjob_operator.views import report

from .test_render import EVENTS, JOB, NOW

RECOVERED: dict[str, Any] = {
    "type": "Normal", "reason": "IncidentRecovered", "lastTimestamp": "2026-11-27T12:05:06Z",
    "message": "incident #1 (NodeLost) recovered in 6s, training at global step 330 (firstStep 6.0s)"}


def t(hms: str) -> datetime:
    return datetime.fromisoformat(f"2026-11-27T{hms}+00:00")


def test_points_are_the_start_each_resume_and_the_last_step() -> None:
    tl = report.timeline(JOB, [*EVENTS, RECOVERED], NOW)
    assert tl.points == [(t("12:00:00"), 0), (t("12:05:06"), 330), (t("12:09:59"), 400)]
    assert tl.spans == [report.Span(1, "NodeLost", t("12:05:00"), t("12:05:06"), open=False)]
    assert tl.checkpoints == [(t("12:09:55"), 390)]
    assert tl.title == "ml/charlm: Running, 1 incident(s), goodput 99.0%"


def test_an_incident_still_recovering_runs_to_now_and_a_finished_job_stops_at_its_end() -> None:
    status = {**JOB["status"], "incidents": [{"id": 2, "cause": "PodDeleted", "startTime": "2026-11-27T12:08:00Z",
                                              "outcome": "Recovering"}]}
    tl = report.timeline({**JOB, "status": status}, [], NOW)
    assert tl.spans == [report.Span(2, "PodDeleted", t("12:08:00"), NOW, open=True)]
    done = {**status, "state": "Failed", "completionTime": "2026-11-27T12:09:00Z"}
    assert report.timeline({**JOB, "status": done}, [], NOW).spans[0].end == t("12:09:00")


def test_nothing_known_yet() -> None:
    tl = report.timeline({"metadata": {"name": "j", "namespace": "ml"}, "status": {}}, [], NOW)
    assert (tl.points, tl.spans, tl.checkpoints) == ([], [], [])
    assert tl.title == "ml/j: ?, 0 incident(s), not started"


def test_draw_writes_a_png(tmp_path: Path) -> None:
    out = tmp_path / "job.png"
    report.draw(report.timeline(JOB, [*EVENTS, RECOVERED], NOW), out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000

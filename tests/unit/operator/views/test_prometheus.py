"""`kubectl ddpjob report --prometheus`: the range query, its resolution, and reading Prometheus' answer."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from ddpjob_operator.views import prometheus, report
from ddpjob_operator.views.kubectl import ViewError

from .test_render import EVENTS, JOB, NOW

T0 = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def test_the_query_names_the_job_with_escaped_literals() -> None:
    assert prometheus.query("ml", "charlm") == 'max(ddpjob_job_global_step{ddpjob_namespace="ml",ddpjob_name="charlm"})'
    assert prometheus.query("ml", 'a"b\\').endswith('ddpjob_name="a\\"b\\\\"})')


@pytest.mark.parametrize(("seconds", "step"), [(60, 1.0), (2000, 1.0), (4000, 2.0), (86400 * 7, 302.4)])
def test_a_long_job_widens_the_step_to_stay_under_the_points_limit(seconds: float, step: float) -> None:
    assert prometheus.resolution(T0, T0 + timedelta(seconds=seconds)) == pytest.approx(step)


def test_the_answer_becomes_points_in_time_order() -> None:
    answer = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {}, "values": [[T0.timestamp() + 2, "41"], [T0.timestamp(), "40"], [T0.timestamp() + 1, "40"]]}]}}
    assert prometheus.parse(answer) == [(T0, 40), (T0 + timedelta(seconds=1), 40), (T0 + timedelta(seconds=2), 41)]
    assert prometheus.parse({"status": "success", "data": {"result": []}}) == []


@pytest.mark.parametrize("answer", [{"status": "error", "error": "parse error at char 5"}, ["junk"]])
def test_a_refusal_is_one_line_with_prometheus_reason(answer: Any) -> None:
    with pytest.raises(ViewError, match="Prometheus refused the query"):
        prometheus.parse(answer)


def test_nothing_listens_there() -> None:
    with pytest.raises(ViewError, match=r"^ddpjob: cannot read Prometheus at http://127\.0\.0\.1:9: "):
        prometheus.steps("http://127.0.0.1:9", "ml", "j", T0, T0 + timedelta(minutes=1), timeout=5)


def test_the_series_is_drawn_with_the_status_points(tmp_path: Path) -> None:
    series = [(NOW - timedelta(seconds=s), 400 - s) for s in range(0, 300, 15)]
    tl = report.timeline(JOB, EVENTS, NOW, series)
    assert tl.series == sorted(series) and tl.points  # both: the scrapes and what the status keeps
    out = tmp_path / "job.png"
    report.draw(tl, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000

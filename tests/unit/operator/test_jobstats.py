"""The figures over all jobs that /metrics exports for the alert rules."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from ddpjob_operator.metrics import jobstats

NOW = datetime(2026, 11, 27, 12, 0, 0, tzinfo=UTC)


def job(state: str, incidents: int = 0, limit: int | None = None, stalled: bool = False, recovering: bool = False,
        checkpoint: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"state": state, "incidentCount": incidents,
                              "conditions": [{"type": "Stalled", "status": "True" if stalled else "False"}]}
    if recovering:
        status["incidents"] = [{"id": 1, "outcome": "Recovered"}, {"id": 2, "outcome": "Recovering"}]
    if checkpoint:
        status["progress"] = {"lastCheckpoint": {"step": 10, "time": checkpoint}}
    spec = {"runPolicy": {"backoffLimit": limit}} if limit is not None else {}
    return {"spec": spec, "status": status}


@pytest.mark.parametrize(("bodies", "expected"), [
    ([], jobstats.JobStats()),
    ([job("Running", incidents=3, limit=6)], jobstats.JobStats()),  # half the budget
    ([job("Running", incidents=4, limit=5), job("Queued", incidents=5)], jobstats.JobStats(budget_nearly_spent=2)),
    ([job("Failed", incidents=6, stalled=True)], jobstats.JobStats()),  # finished: nothing to warn about
    ([job("Running", limit=0)], jobstats.JobStats()),  # backoffLimit 0: any incident fails it, nothing to warn
    ([job("Running", stalled=True), job("Suspended", stalled=True)], jobstats.JobStats(stalled=1)),
    ([job("Restarting", recovering=True)], jobstats.JobStats(recovering=1)),
    ([job("Running", checkpoint="2026-11-27T11:50:00Z"), job("Running", checkpoint="2026-11-27T11:59:00Z"),
      job("Succeeded", checkpoint="2026-11-27T01:00:00Z"), job("Running")],
     jobstats.JobStats(max_checkpoint_age=600.0)),
])
def test_collect(bodies: list[dict[str, Any]], expected: jobstats.JobStats) -> None:
    assert jobstats.collect(bodies, NOW) == expected


def named(name: str, step: Any, state: str = "Running") -> dict[str, Any]:
    return {"metadata": {"namespace": "ml", "name": name}, "status": {"state": state, "progress": {"globalStep": step}}}


@pytest.mark.parametrize(("bodies", "expected"), [
    ([], []),
    ([named("a", 12), named("b", 0, "Succeeded")], [("ml", "a", 12), ("ml", "b", 0)]),  # finished: kept till deleted
    ([named("a", None), named("b", True), named("c", "7"), {"status": {"progress": {"globalStep": 3}}}], []),
])
def test_global_steps_one_per_job_that_reported_one(bodies: list[dict[str, Any]],
                                                    expected: list[tuple[str, str, int]]) -> None:
    assert jobstats.global_steps(bodies) == expected

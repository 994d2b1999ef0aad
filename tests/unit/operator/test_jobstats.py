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


def test_every_state_is_a_series_of_ddpjob_jobs_from_the_start_queued_too() -> None:
    """A job Kueue holds (state Queued) is counted: it vanished from the dashboard's jobs-by-state panel."""
    from ddpjob_operator.metrics import registry
    from prometheus_client import REGISTRY

    def jobs(state: str) -> float | None:
        return REGISTRY.get_sample_value("ddpjob_jobs", {"state": state})

    assert {"Created", "Queued", "Running", "Restarting", "Suspended", "Succeeded", "Failed"} <= set(registry.STATES)
    before = jobs("Queued")
    assert before is not None
    registry.move_job_state(None, "Queued")
    registry.move_job_state("Queued", "Running")
    registry.move_job_state("Running", "Queued")
    assert jobs("Queued") == before + 1
    registry.move_job_state("Queued", None)
    assert jobs("Queued") == before


def full(name: str, state: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": "ml", "name": name}, "spec": {"runPolicy": {"backoffLimit": 5}},
            "status": {"state": state, **status}}


def test_per_job_figures_name_the_job_for_the_alerts() -> None:
    stalled = [{"type": "Stalled", "status": "True"}]
    incidents = [{"id": 1, "cause": "Stalled", "startTime": "2026-11-27T11:00:00Z"},
                 {"id": 2, "cause": "Stalled", "startTime": "2026-11-27T11:50:00Z"},
                 {"id": 3, "cause": "NodeLost", "startTime": "2026-11-27T11:55:00Z"}]
    got = {f.name: f for f in jobstats.per_job([
        full("a", "Running", conditions=stalled, incidentCount=4, incidents=incidents,
             progress={"lastCheckpoint": {"time": "2026-11-27T11:00:00Z"}}),
        full("b", "Queued", incidentCount=1),
        full("c", "Failed", conditions=stalled, incidentCount=6),
        {"status": {"state": "Running"}},  # no name: no series
    ], NOW)}
    assert sorted(got) == ["a", "b", "c"]
    a = got["a"]
    assert (a.namespace, a.stalled, a.budget_used, a.checkpoint_age) == ("ml", 1.0, 0.8, 3600.0)
    assert a.last_stall == datetime(2026, 11, 27, 11, 50, tzinfo=UTC).timestamp()
    assert (got["b"].stalled, got["b"].budget_used, got["b"].checkpoint_age) == (None, 0.2, None)
    assert (got["c"].stalled, got["c"].budget_used) == (None, None), "finished: nothing to alert on"

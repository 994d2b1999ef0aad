"""report_cadence.interval (issue 46): a write budget for every running job's routine progress reports."""

from __future__ import annotations

import pytest
from ddpjob_operator.planner.policies import report_cadence


@pytest.mark.parametrize(("jobs", "budget", "seconds"), [
    (0, 50, None),
    (500, 50, None),  # 50 writes/s at the worker's own 10 s: within the budget, the status says nothing
    (501, 50, 20),
    (1000, 50, 20),
    (1000, 20, 80),
    (1000, 40, 40),
    (5000, 50, 160),
    (100_000, 50, 320),  # the longest cadence, whatever the number
    (100_000, 0, None),  # no budget
])
def test_the_cadence_doubles_until_the_running_jobs_fit_the_budget(jobs: int, budget: float,
                                                                    seconds: int | None) -> None:
    assert report_cadence.interval(jobs, budget) == seconds
    effective = seconds or report_cadence.BASE_SECONDS
    assert budget <= 0 or jobs / effective <= budget or effective == report_cadence.MAX_SECONDS


@pytest.mark.parametrize(("cadence", "deadline", "seconds"), [
    (None, 900, None),
    (80, 900, 80),
    (320, 900, 112),  # an eighth of the stall deadline: a reporter backing off 4x waits at most half of it
    (80, 120, 15),
    (80, 80, None),  # 10 s is the worker's own: the status says nothing
    (80, 60, None),
    (80, 0, 80),  # no stall check
])
def test_a_jobs_cadence_is_at_most_an_eighth_of_its_stall_deadline(cadence: int | None, deadline: int,
                                                                     seconds: int | None) -> None:
    assert report_cadence.for_job(cadence, deadline) == seconds


def test_the_status_carries_the_cadence_of_a_job_that_runs_and_drops_it_once_finished() -> None:
    import dataclasses

    from ddpjob_operator.planner.plan import plan
    from ddpjob_worker.contract import STATUS_REPORT_INTERVAL

    from .factories import at, running_cluster

    c = running_cluster(replicas=2)
    assert c.job is not None
    quiet = plan(c.job, c.observed(), at(5))
    assert STATUS_REPORT_INTERVAL not in quiet.status or quiet.status[STATUS_REPORT_INTERVAL] is None
    busy = plan(c.job, dataclasses.replace(c.observed(), report_interval=80), at(5))
    assert busy.status[STATUS_REPORT_INTERVAL] == 80 and busy.patch[STATUS_REPORT_INTERVAL] == 80
    c.job.setdefault("status", {})[STATUS_REPORT_INTERVAL] = 80
    c.job["spec"].setdefault("runPolicy", {})["progressDeadlineSeconds"] = 120
    capped = plan(c.job, dataclasses.replace(c.observed(), report_interval=80), at(5))
    assert capped.status[STATUS_REPORT_INTERVAL] == 15
    for pod in c.pods.values():
        pod["status"] = {"phase": "Succeeded", "containerStatuses": [
            {"name": "worker", "state": {"terminated": {"exitCode": 0, "finishedAt": "2026-01-01T00:00:00Z"}}}]}
    done = plan(c.job, dataclasses.replace(c.observed(), report_interval=80), at(400))
    assert done.status["state"] == "Succeeded" and done.status.get(STATUS_REPORT_INTERVAL) is None


def test_the_controller_counts_the_jobs_that_will_report_before_they_run() -> None:
    """A burst of new jobs sets the cadence while they are Created, so their Running write carries it: counted by
    Running alone, each doubling rewrote every running job's status (3 times each while 5,000 jobs started)."""
    from ddpjob_operator.planner import status as st
    from ddpjob_operator.runtime import controller as ctl

    c = ctl.Controller()
    for i in range(1000):
        c._set_state(("ns", f"j{i}"), st.CREATED)
    assert c.report_interval() == 20, "1,000 jobs about to run: 20 s before any of them is Running"
    for i in range(1000):
        c._set_state(("ns", f"j{i}"), st.RUNNING if i % 2 else st.RESTARTING)
    assert c.report_interval() == 20, "the same jobs Running or Restarting: the same cadence, no rewrite"
    for i in range(600):
        c._set_state(("ns", f"j{i}"), st.SUCCEEDED if i % 3 else st.FAILED)
    c._set_state(("ns", "j999"), None)  # deleted
    c._set_state(("ns", "queued"), st.QUEUED)
    assert c.report_interval() is None, "399 jobs left that report: the worker's own 10 s fits"

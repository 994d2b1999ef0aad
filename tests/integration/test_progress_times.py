"""A worker-written time can never wedge a job (issue 43 #7): the API server's format: date-time lets through
RFC 3339 forms Python's fromisoformat refuses (a lower-case t and z) and dates no clock reads; the operator reads
the first, ignores the second, says so once, and goes on reconciling the job."""

from __future__ import annotations

import json

from tests.conftest import Cluster, wait_for
from tests.integration.operator_support import Jobs, OperatorProcess, small_job


def test_a_time_the_api_server_accepts_never_stops_the_jobs_reconciliation(
        cluster: Cluster, namespace: str, operator: OperatorProcess, jobs: Jobs) -> None:
    jobs.apply(small_job("times", 2))
    jobs.running("times", 2)
    progress = {"globalStep": 5, "lastStepTime": "2026-01-01t00:00:00.5z", "updateTime": "2026-01-01t00:00:00z",
                "start": {"rendezvousTime": "2026-01-01T00:00:00+99:00"}}
    # Accepted as written: these are what the operator must live with (the CRD says format: date-time).
    cluster.kubectl("patch", "ddpjob", "times", "-n", namespace, "--subresource=status", "--type=merge",
                    "-p", json.dumps({"status": {"progress": progress}}))
    assert jobs.get("times")["status"]["progress"]["start"]["rendezvousTime"] == "2026-01-01T00:00:00+99:00"

    def said() -> list[str]:
        return [e.get("message", "") for e in jobs.events("times") if e.get("reason") == "ProgressUnreadable"]

    wait_for(said, timeout=60, describe="a ProgressUnreadable Event", state=lambda: operator.tail(40))
    # Still reconciled: a failed worker is counted and replaced.
    jobs.fail("times-worker-1", 137)
    wait_for(lambda: jobs.get("times")["status"].get("restarts") == 1, timeout=60, describe="restarts == 1",
             state=lambda: operator.tail(40))
    jobs.running("times", 2)
    [message] = said()  # once per job, not once per pass
    assert "status.progress.start.rendezvousTime='2026-01-01T00:00:00+99:00'" in message
    assert "lastStepTime" not in message and "updateTime" not in message, "lower-case t and z are read"
    assert "Traceback" not in operator.tail(400)

"""A child the API server rejects as invalid fails the job (policies/rejected.py), in a status the planner builds
like any other: the job's history stays (issue 43: a job with 2 incidents ended with 0)."""

from __future__ import annotations

import dataclasses

import pytest
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.plan import plan
from ddpjob_operator.planner.policies import rejected
from ddpjob_operator.planner.policies.rejected import Rejection

from .factories import at, running_cluster


@pytest.mark.parametrize(("kind", "reason"), [("Pod", "InvalidPodTemplate"), ("Service", "ChildRejected"),
                                              ("PersistentVolumeClaim", "ChildRejected")])
def test_the_reason_names_whose_fault_it_is(kind: str, reason: str) -> None:
    got, message = rejected.failure(Rejection(kind, "x", "spec.foo: Invalid value"))
    assert got == reason and message == f"the API server rejected {kind} x: spec.foo: Invalid value"


def test_a_rejection_fails_the_job_keeping_its_incidents_counts_and_selector() -> None:
    c = running_cluster(replicas=2)
    c.set_phase("job-worker-1", "Failed", exit_code=137, finished=at(10))
    c.step(at(11))  # counted, not yet replaced
    before = dict(c.status)
    assert before["incidentCount"] == 1 and before["countedFailures"]
    rejection = Rejection("Pod", "job-worker-1", "spec.containers[0].resources: bad quantity")
    out = plan(c.jobobj, dataclasses.replace(c.observed(), rejected=rejection), at(12))
    assert out.create_pods == [] and out.ensure == []
    cond = st.get_condition(out.status, st.FAILED)
    assert cond is not None and cond["reason"] == "InvalidPodTemplate" and "bad quantity" in cond["message"]
    for key in ("incidentCount", "restarts", "countedFailures", "selector", "startTime"):
        assert out.status[key] == before[key], key
    assert out.status["incidents"][-1]["outcome"] == "Failed" and out.status["completionTime"]
    assert [e.reason for e in out.events] == ["InvalidPodTemplate"]

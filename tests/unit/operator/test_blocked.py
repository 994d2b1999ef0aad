"""Pods held back by the API server's answers to the last creates (policies/blocked.py): a rule of the planner, so
the plan says which pods a pass creates, and the I/O layer (runtime/apply.py) creates exactly those."""

from __future__ import annotations

import pytest
from ddpjob_operator.api import reasons
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.plan import Observed, plan
from ddpjob_operator.planner.policies import blocked
from ddpjob_operator.planner.policies.children import Problem

from .factories import at, make_job
from .test_gang import gang_job

NO_CRD = Problem("PodGroup", "job", False, reasons.CRD_NOT_INSTALLED, "the PodGroup API is not served")
NO_WORKLOAD = Problem("Workload", "w", False, reasons.FORBIDDEN, "forbidden")
POD_TAKEN = Problem("Pod", "job-worker-1", True, reasons.CHILD_CONFLICT, "Pod job-worker-1 exists and is not ours")
SA_TAKEN = Problem("ServiceAccount", "ddpjob-worker", True, reasons.CHILD_CONFLICT, "ServiceAccount taken")
QUOTA = Problem("Pod", "job-worker-0", False, reasons.QUOTA_EXCEEDED, "exceeded quota")


@pytest.mark.parametrize(("problems", "held", "retry", "conflicts"), [
    ([], False, set(), 0),
    ([QUOTA], False, set(), 0),  # a refused pod is tried again with backoff, the others go on
    ([NO_CRD], True, set(), 0),
    ([NO_WORKLOAD], True, set(), 0),
    ([POD_TAKEN], True, {"job-worker-1"}, 1),  # only the taken name is tried again
    ([POD_TAKEN, NO_CRD], True, set(), 1),
    ([SA_TAKEN], True, set(), 1),  # the worker identity: never run pods under a foreign ServiceAccount
    ([SA_TAKEN, POD_TAKEN], True, set(), 2),
])
def test_blocked(problems: list[Problem], held: bool, retry: set[str], conflicts: int) -> None:
    got = blocked.decide({(p.kind, p.name): p for p in problems})
    assert (got.held, set(got.retry), len(got.conflicts)) == (held, retry, conflicts)


def test_a_gang_job_whose_pod_group_cannot_be_created_plans_no_pod() -> None:
    p = plan(gang_job(2), Observed(problems={("PodGroup", "job"): NO_CRD}), at(0))
    assert p.create_pods == [] and [o["kind"] for o in p.ensure][-1] == "PodGroup", "the PodGroup is tried again"
    refused = st.get_condition(p.status, st.CREATE_REFUSED)
    assert refused is not None and refused["reason"] == reasons.CRD_NOT_INSTALLED


def test_a_pod_name_taken_by_a_foreign_pod_is_tried_again_alone_and_named() -> None:
    p = plan(make_job(replicas=2).obj(), Observed(problems={("Pod", "job-worker-1"): POD_TAKEN}), at(0))
    assert [o["metadata"]["name"] for o in p.create_pods] == ["job-worker-1"]
    conflict = st.get_condition(p.status, st.CHILD_CONFLICT)
    assert conflict is not None and conflict["status"] == "True" and "job-worker-1" in conflict["message"]
    assert p.requeue_after == 10.0, "looked at again while the name is taken"

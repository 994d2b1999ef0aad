"""Issue 43 #10: the job's NetworkPolicy fails closed. While its create is refused no pod is created (condition
CreateRefused, reason NetworkPolicyRefused, naming the cause and the opt-out); ``spec.networkPolicy: Disabled`` is
the explicit opt-out: no NetworkPolicy, and an answer about one from before holds nothing."""

from __future__ import annotations

import pytest
from ddpjob_operator.api import reasons
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.plan import Observed, plan
from ddpjob_operator.planner.policies import blocked
from ddpjob_operator.planner.policies.children import Problem

from .factories import at, make_job

pytestmark = pytest.mark.unit

RBAC = Problem("NetworkPolicy", "job-rdzv", False, reasons.FORBIDDEN,
               'networkpolicies.networking.k8s.io is forbidden: User "op" cannot create resource "networkpolicies"')
WEBHOOK = Problem("NetworkPolicy", "job-rdzv", False, reasons.ADMISSION_DENIED,
                  'admission webhook "np.example" denied the request: tenants may not create NetworkPolicies')
TAKEN = Problem("NetworkPolicy", "job-rdzv", True, reasons.CHILD_CONFLICT, "NetworkPolicy job-rdzv exists")
QUOTA = Problem("Pod", "job-worker-0", False, reasons.QUOTA_EXCEEDED, "exceeded quota")


@pytest.mark.parametrize(("problems", "required", "held", "first_reason"), [
    ([], True, False, None),
    ([RBAC], True, True, reasons.NETWORK_POLICY_REFUSED),
    ([WEBHOOK], True, True, reasons.NETWORK_POLICY_REFUSED),
    ([QUOTA, WEBHOOK], True, True, reasons.NETWORK_POLICY_REFUSED),  # the one that holds every pod comes first
    ([TAKEN], True, True, reasons.CHILD_CONFLICT),
    ([RBAC], False, False, None),  # opted out: a refusal from before the edit holds nothing
    ([TAKEN], False, False, None),
    ([QUOTA, RBAC], False, False, reasons.QUOTA_EXCEEDED),
])
def test_a_network_policy_that_cannot_be_made_holds_every_pod(problems: list[Problem], required: bool, held: bool,
                                                              first_reason: str | None) -> None:
    found = blocked.relevant({(p.kind, p.name): p for p in problems}, required)
    assert blocked.decide(found).held is held
    assert next((p.reason for p in found.values()), None) == first_reason


def _refused(body: dict[str, object], problem: Problem) -> tuple[list[str], list[str], dict[str, object] | None]:
    p = plan(body, Observed(problems={(problem.kind, problem.name): problem}), at(0))
    return ([o["metadata"]["name"] for o in p.create_pods], [f"{o['kind']}/{o['metadata']['name']}" for o in p.ensure],
            dict(st.get_condition(p.status, st.CREATE_REFUSED) or {}) or None)


def test_a_refused_network_policy_creates_no_pod_and_says_why_and_how_to_opt_out() -> None:
    pods, ensure, refused = _refused(make_job(replicas=2).obj(), WEBHOOK)
    assert pods == [] and "NetworkPolicy/job-rdzv" in ensure, "no pod; the NetworkPolicy is tried again"
    assert refused is not None and refused["status"] == "True" and refused["reason"] == "NetworkPolicyRefused"
    message = str(refused["message"])
    assert "tenants may not create NetworkPolicies" in message and "no pod is created until it exists" in message
    assert "AdmissionDenied" in message and "spec.networkPolicy: Disabled" in message


def test_disabled_creates_no_network_policy_and_runs_the_pods() -> None:
    body = make_job(replicas=2).with_spec(networkPolicy="Disabled").obj()
    pods, ensure, refused = _refused(body, RBAC)
    assert pods == ["job-rdzv", "job-worker-0", "job-worker-1"]
    assert not any(e.startswith("NetworkPolicy/") for e in ensure) and refused is None
    assert "NetworkPolicy/job-rdzv" in _refused(make_job(replicas=2).obj(), QUOTA)[1], "Required is the default"

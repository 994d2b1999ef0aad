"""Issue 43 #4: without the chart's worker admission policy (or its binding) any worker pod of a namespace can write
any job's status there. The operator reads both at start and every resync and says what it found: on every job it
runs (condition StatusUnprotected and its Warning Event), in ddpjob_worker_admission_policy{state}, in `kubectl
ddpjob describe` and in its log."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from ddpjob_operator.kube.kopf_compat import kopf_errors
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.plan import Observed, plan
from ddpjob_operator.planner.policies import isolation
from ddpjob_operator.runtime.isolation import IsolationCheck
from ddpjob_operator.views import describe
from prometheus_client import REGISTRY

from .factories import at, make_job, running_cluster

pytestmark = pytest.mark.unit

NAME = "ddpjob-system-ddpjob-operator-worker-status"
POLICY = {"metadata": {"name": NAME}, "spec": {"failurePolicy": "Fail"}}
BINDING = {"metadata": {"name": NAME}, "spec": {"policyName": NAME, "validationActions": ["Deny"]}}


@pytest.mark.parametrize(("name", "policy", "binding", "error", "state"), [
    (NAME, POLICY, BINDING, "", isolation.PRESENT),
    (NAME, None, None, "", isolation.ABSENT),  # not there, or the API not served (Kubernetes < 1.30)
    (NAME, POLICY, None, "", isolation.ABSENT),  # a policy without its binding does nothing
    (NAME, POLICY, {"spec": {"policyName": "other", "validationActions": ["Deny"]}}, "", isolation.ABSENT),
    (NAME, POLICY, {"spec": {"policyName": NAME, "validationActions": ["Audit"]}}, "", isolation.ABSENT),
    (NAME, None, None, "403 forbidden", isolation.UNKNOWN),
    ("", None, None, "", isolation.UNCHECKED),
])
def test_the_verdict_on_the_policy_and_its_binding(name: str, policy: Any, binding: Any, error: str,
                                                   state: str) -> None:
    assert isolation.judge(name, policy, binding, error).state == state


def _status(verdict: isolation.Verdict | None, body: dict[str, Any] | None = None) -> tuple[dict[str, Any], Any]:
    p = plan(body or make_job(replicas=2).obj(), Observed(worker_isolation=verdict), at(0))
    return p.status, p.events


def test_every_running_job_says_its_status_is_unprotected_and_warns_once() -> None:
    status, events = _status(isolation.judge(NAME, None, None))
    cond = st.get_condition(status, st.STATUS_UNPROTECTED) or {}
    assert (cond.get("status"), cond.get("reason")) == ("True", "AdmissionPolicyMissing")
    assert NAME in cond["message"] and "Kubernetes 1.30" in cond["message"]
    assert [(e.type, e.reason) for e in events if e.reason == "StatusUnprotected"] == [("Warning", "StatusUnprotected")]
    body = make_job(replicas=2).with_status(**status).obj()
    _, events = _status(isolation.judge(NAME, None, None), body)
    assert not any(e.reason == "StatusUnprotected" for e in events), "once, when it becomes True"
    fixed, _ = _status(isolation.judge(NAME, POLICY, BINDING), body)
    cond = st.get_condition(fixed, st.STATUS_UNPROTECTED) or {}
    assert (cond.get("status"), cond.get("reason")) == ("False", "AdmissionPolicyInForce")


@pytest.mark.parametrize("verdict", [None, isolation.judge("", None, None), isolation.judge(NAME, POLICY, BINDING)])
def test_no_condition_while_unchecked_or_in_force_from_the_start(verdict: isolation.Verdict | None) -> None:
    assert st.get_condition(_status(verdict)[0], st.STATUS_UNPROTECTED) is None


def test_a_held_job_says_it_too() -> None:
    body = make_job(replicas=2).with_run_policy(suspend=True).obj()
    cond = st.get_condition(_status(isolation.judge(NAME, None, None, "timeout"), body)[0], st.STATUS_UNPROTECTED)
    assert cond is not None and cond["reason"] == "AdmissionPolicyUnverified"


class Objects:
    """get_cluster_scoped of the two objects, or an error."""

    def __init__(self, objects: dict[str, Any], error: Exception | None = None) -> None:
        self.objects, self.error, self.reads = objects, error, 0

    async def get_cluster_scoped(self, api_version: str, plural: str, name: str) -> Any:
        self.reads += 1
        if self.error is not None:
            raise self.error
        assert api_version == "admissionregistration.k8s.io/v1" and name == NAME
        return self.objects.get(plural)


def _state() -> dict[str, float]:
    return {s: REGISTRY.get_sample_value("ddpjob_worker_admission_policy", {"state": s}) or 0.0
            for s in isolation.STATES}


def test_the_check_sets_the_metric_and_says_when_it_changes(caplog: pytest.LogCaptureFixture) -> None:
    check = IsolationCheck(NAME)
    absent = Objects({})
    assert asyncio.run(check.refresh(absent)) is True  # type: ignore[arg-type]
    assert _state() == {"present": 0, "absent": 1, "unknown": 0, "unchecked": 0}
    assert "worker admission policy absent" in caplog.text and caplog.records[-1].levelname == "WARNING"
    assert asyncio.run(check.refresh(absent)) is False  # type: ignore[arg-type]
    both = Objects({"validatingadmissionpolicies": POLICY, "validatingadmissionpolicybindings": BINDING})
    assert asyncio.run(check.refresh(both)) is True and check.verdict is not None  # type: ignore[arg-type]
    assert check.verdict.state == "present" and _state()["present"] == 1
    forbidden = kopf_errors.APIForbiddenError(cast(Any, {"message": "forbidden"}), status=403, headers={})
    asyncio.run(check.refresh(Objects({}, forbidden)))  # type: ignore[arg-type]
    assert _state()["unknown"] == 1
    assert asyncio.run(IsolationCheck("").refresh(absent)) is True and _state()["unchecked"] == 1  # type: ignore


def test_describe_shows_it_near_the_top() -> None:
    c = running_cluster(replicas=2)
    status, _ = _status(isolation.judge(NAME, None, None), c.jobobj)
    text = describe.render({**c.jobobj, "status": status}, [], at(10))
    line = next(x for x in text.splitlines() if x.startswith("Security:"))
    assert "status writable by any worker pod of the namespace (AdmissionPolicyMissing)" in line and NAME in line
    assert text.index("Security:") < text.index("Workers:")
    assert "StatusUnprotected" in text.split("Conditions:")[1]

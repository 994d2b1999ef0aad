"""Invalid edits (issue 23 #4): a job that never started fails with InvalidSpec; a running job goes on with its
last valid spec (or is held as it is) under the SpecRejected condition, never Failed with its pods running."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
from ddpjob_operator.api.spec import InvalidSpec, parse_ddpjob
from ddpjob_operator.planner import plan as planner
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.policies import edits

from .factories import at, running_cluster

BAD_ENV = [{"name": "DDPJOB_DNS_WAIT_SECONDS", "value": "soon"}]


def broken(job: dict[str, Any]) -> dict[str, Any]:
    """``job`` with an edit the schema lets through and the operator refuses."""
    bad = copy.deepcopy(job)
    bad["spec"]["template"]["spec"]["containers"][0]["env"] = BAD_ENV
    bad["metadata"]["generation"] = int(bad["metadata"].get("generation") or 1) + 1
    return bad


@pytest.mark.parametrize(("status", "pods", "last_valid", "action"), [
    ({}, False, None, "fail"),  # never started: bad input, nothing lost
    ({}, False, "valid", "fail"),
    ({"startTime": "2026-01-01T00:00:00Z"}, True, "valid", "keep"),
    ({"startTime": "2026-01-01T00:00:00Z"}, True, None, "hold"),  # the operator restarted since
    ({}, True, "valid", "keep"),  # pods before the first status write
    ({"startTime": "x", "conditions": [{"type": "Succeeded", "status": "True"}]}, False, "valid", "ended"),
    ({"conditions": [{"type": "Failed", "status": "True", "reason": "InvalidSpec"}]}, False, None, "ended"),
    ({"startTime": "x"}, True, "invalid", "hold"),  # nothing this version can run
])
def test_what_an_invalid_spec_does(status: dict[str, Any], pods: bool, last_valid: str | None, action: str) -> None:
    cluster = running_cluster(2)
    assert cluster.job is not None
    job = cluster.job
    seen = cluster.observed().pods if pods else []
    spec = {"valid": job["spec"], "invalid": broken(job)["spec"], None: None}[last_valid]
    edit = edits.decide(broken(job), status, seen, spec)
    assert edit.action == action
    assert (edit.job is not None) == (action == "keep")


def test_a_running_job_goes_on_with_its_last_valid_spec_and_says_why() -> None:
    cluster = running_cluster(2)
    assert cluster.job is not None
    valid = copy.deepcopy(cluster.job["spec"])
    cluster.job = broken(cluster.job)
    lost = next(iter(sorted(n for n in cluster.pods if "worker" in n)))
    del cluster.pods[lost]  # a worker lost after the edit: replaced from the last valid spec
    plan = planner.plan(cluster.job, dataclasses.replace(cluster.observed(), last_valid_spec=valid), at(30))
    assert not st.condition_true(plan.status, st.FAILED) and plan.status["state"] != st.FAILED, plan.status
    cond = st.get_condition(plan.status, st.SPEC_REJECTED) or {}
    assert cond.get("status") == "True" and "DDPJOB_DNS_WAIT_SECONDS='soon'" in cond["message"], cond
    assert "goes on with the last valid spec" in cond["message"]
    assert [p["metadata"]["name"] for p in plan.create_pods] == [lost]
    env = {e["name"]: e.get("value") for e in plan.create_pods[0]["spec"]["containers"][0]["env"]}
    assert env.get("DDPJOB_DNS_WAIT_SECONDS") is None, "the replacement comes from the last valid spec"
    assert isinstance(plan.invalid, InvalidSpec)


def test_without_a_valid_spec_the_job_is_held_as_it_is() -> None:
    cluster = running_cluster(2)
    assert cluster.job is not None
    cluster.job = broken(cluster.job)
    plan = cluster.plan(at(30))
    assert plan.status["state"] == cluster.job["status"]["state"] != st.FAILED
    assert not plan.create_pods and not plan.delete_pods
    cond = st.get_condition(plan.status, st.SPEC_REJECTED) or {}
    assert cond.get("status") == "True" and "holds the job as it is" in cond["message"], cond


def test_the_condition_clears_once_the_spec_is_valid_again() -> None:
    cluster = running_cluster(2)
    assert cluster.job is not None
    good = copy.deepcopy(cluster.job)
    cluster.job = broken(cluster.job)
    cluster.apply(cluster.plan(at(30)))
    assert st.condition_true(cluster.job["status"], st.SPEC_REJECTED)
    good["status"] = cluster.job["status"]
    cluster.job = good
    plan = cluster.plan(at(40))
    cond = st.get_condition(plan.status, st.SPEC_REJECTED) or {}
    assert cond.get("status") == "False" and cond.get("reason") == "SpecAccepted", cond
    parse_ddpjob(good)

"""Issue 43 #4 against a real API server: with the worker admission policy absent the operator says so on the job
(condition StatusUnprotected and its Warning Event), in ddpjob_worker_admission_policy and in `kubectl ddpjob
describe`; once the policy and its binding exist, the next check (a resync period) says they are in force."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Cluster, wait_for
from tests.integration.operator_support import Jobs, OperatorProcess, small_job

NAME = "iso"


@pytest.fixture
def checking_operator(cluster: Cluster, namespace: str, ddpjob_crd: str, tmp_path: Path
                      ) -> Iterator[tuple[OperatorProcess, str]]:
    """The operator told to check a policy that does not exist (yet); resync every 3 s."""
    policy = f"{namespace}-worker-status"
    op = OperatorProcess(cluster, namespace, tmp_path, resync_seconds=3,
                         extra_args=("--worker-admission-policy", policy))
    op.start()
    try:
        yield op, policy
    finally:
        op.stop()
        for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy"):
            cluster.kubectl("delete", kind, policy, "--ignore-not-found", check=False)


def _policy(name: str, namespace: str) -> str:
    """A policy and binding of that name that deny nothing (only their existence is checked), scoped to this
    test's namespace."""
    rules = [{"apiGroups": ["ddpjob.io"], "apiVersions": ["*"], "operations": ["UPDATE"],
              "resources": ["ddpjobs/status"]}]
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": name}, "spec": {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": rules},
                                              "validations": [{"expression": "true"}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": {"name": name}, "spec": {"policyName": name, "validationActions": ["Deny"], "matchResources": {
             "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}}}]})


def test_a_missing_worker_admission_policy_is_reported_on_the_job_in_the_metric_and_in_describe(
        cluster: Cluster, namespace: str, jobs: Jobs, checking_operator: tuple[OperatorProcess, str]) -> None:
    op, policy = checking_operator
    jobs.apply(small_job(NAME))
    cond = jobs.wait_condition(NAME, "StatusUnprotected", timeout=30)
    assert cond["reason"] == "AdmissionPolicyMissing" and policy in cond["message"], cond
    warned = wait_for(lambda: [e for e in jobs.events(NAME) if e["reason"] == "StatusUnprotected"], timeout=30,
                      describe="the StatusUnprotected Event")
    assert warned[0]["type"] == "Warning" and policy in warned[0]["message"]
    assert 'ddpjob_worker_admission_policy{state="absent"} 1.0' in op.metrics()
    text = cluster.ddpjob("describe", NAME, "-n", namespace).stdout
    line = next((x for x in text.splitlines() if x.startswith("Security:")), "")
    assert "status writable by any worker pod of the namespace (AdmissionPolicyMissing)" in line, text
    assert "worker admission policy absent" in op.tail(200)

    cluster.kubectl("apply", "-f", "-", stdin=_policy(policy, namespace))
    wait_for(lambda: jobs.conditions(NAME)["StatusUnprotected"]["status"] == "False", timeout=30,
             describe="StatusUnprotected False after the next check", state=lambda: jobs.describe(NAME))
    assert jobs.conditions(NAME)["StatusUnprotected"]["reason"] == "AdmissionPolicyInForce"
    assert 'ddpjob_worker_admission_policy{state="present"} 1.0' in op.metrics()
    assert "Security:" not in cluster.ddpjob("describe", NAME, "-n", namespace).stdout

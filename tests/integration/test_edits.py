"""Issue 23 #4 against the real API server: an edit of a running job that the schema accepts and the operator
refuses does not fail the job while its pods run; the job goes on with its last valid spec (a lost worker is
replaced from it) under SpecRejected, and the condition clears when the edit is reverted."""

from __future__ import annotations

import json

from tests.conftest import Cluster, wait_for
from tests.integration.operator_support import Jobs, OperatorProcess, small_job

BAD_ENV = [{"name": "DDPJOB_DNS_WAIT_SECONDS", "value": "soon"}]


def _patch_env(cluster: Cluster, ns: str, name: str, env: list[dict[str, str]] | None) -> None:
    job = json.loads(cluster.kubectl("get", "ddpjob", name, "-n", ns, "-o", "json").stdout)
    container = job["spec"]["template"]["spec"]["containers"][0]
    if env is None:
        container.pop("env", None)
    else:
        container["env"] = env
    patch = {"spec": {"template": job["spec"]["template"]}}
    cluster.kubectl("patch", "ddpjob", name, "-n", ns, "--type=merge", "-p", json.dumps(patch))


def test_an_invalid_edit_of_a_running_job_keeps_it_running_on_its_last_valid_spec(
    cluster: Cluster, namespace: str, operator: OperatorProcess, jobs: Jobs
) -> None:
    jobs.apply(small_job("edited", 2))
    before = jobs.running("edited", 2)
    _patch_env(cluster, namespace, "edited", BAD_ENV)
    rejected = jobs.wait_condition("edited", "SpecRejected", timeout=30)
    assert "DDPJOB_DNS_WAIT_SECONDS='soon'" in rejected["message"], rejected
    assert "goes on with the last valid spec" in rejected["message"], rejected
    status = jobs.get("edited")["status"]
    assert status["state"] == "Running" and jobs.condition("edited", "Failed") is None, status
    assert [p["metadata"]["uid"] for p in jobs.live_pods("edited")] == [p["metadata"]["uid"] for p in before]

    # A worker lost meanwhile comes back, built from the last valid spec.
    lost = before[1]["metadata"]["name"]
    cluster.kubectl("delete", "pod", lost, "-n", namespace, "--wait=false")
    again = wait_for(lambda: (p := {x["metadata"]["name"]: x for x in jobs.live_pods("edited")}).get(lost)
                     and p[lost]["metadata"]["uid"] != before[1]["metadata"]["uid"] and p[lost], timeout=60,
                     describe=f"{lost} replaced", state=lambda: jobs.describe("edited"))
    env = {e["name"]: e.get("value") for e in again["spec"]["containers"][0].get("env") or []}
    assert env.get("DDPJOB_DNS_WAIT_SECONDS") is None, "the replacement came from the invalid spec"

    # The edit reverted: the condition clears, the job never failed.
    _patch_env(cluster, namespace, "edited", None)
    wait_for(lambda: jobs.conditions("edited").get("SpecRejected", {}).get("status") == "False", timeout=30,
             describe="SpecRejected False", state=lambda: jobs.describe("edited"))
    assert jobs.condition("edited", "Failed") is None

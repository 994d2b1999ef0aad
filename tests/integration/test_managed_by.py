"""Issue 45 #1 against the real API server: a DDPJob whose spec.managedBy names another controller (MultiKueue on a
manager cluster, or a controller of the user's) gets nothing from this operator (no pod, Service, Workload or status
write) while a job beside it runs; and the API server keeps managedBy as it was created (CEL)."""

from __future__ import annotations

import json
import time

from tests.conftest import Cluster
from tests.integration.operator_support import Jobs, OperatorProcess, small_job

OTHER = "example.com/other-controller"


def _refused(cluster: Cluster, namespace: str, name: str, patch: dict[str, object]) -> str:
    proc = cluster.kubectl("patch", "ddpjob", name, "-n", namespace, "--type=merge", "-p", json.dumps(patch),
                           check=False)
    assert proc.returncode != 0, f"the API server took {patch} for {name}"
    return proc.stderr


def test_a_job_managed_by_another_controller_gets_no_pods_and_keeps_its_manager(
    cluster: Cluster, namespace: str, operator: OperatorProcess, jobs: Jobs
) -> None:
    jobs.apply(small_job("theirs", 2, managedBy=OTHER))
    jobs.apply(small_job("mine", 1))
    jobs.running("mine", 1)  # the operator has seen both by now (one watch, in order)
    time.sleep(3)  # and a pass for "theirs", had one been queued, would have created its children by now
    theirs = jobs.get("theirs")
    assert "status" not in theirs, theirs.get("status")
    left = cluster.kubectl("get", "pods,services,networkpolicies", "-n", namespace, "-l",
                           "ddpjob.io/job-name=theirs", "-o", "name").stdout.split()
    assert left == [], left
    assert f"job={namespace}/theirs is managed by {OTHER}" in operator.tail(400)

    assert "spec.managedBy is immutable" in _refused(cluster, namespace, "theirs",
                                                     {"spec": {"managedBy": "example.com/another"}})
    assert "cannot be added or removed" in _refused(cluster, namespace, "mine",
                                                    {"spec": {"managedBy": OTHER}})
    assert "cannot be added or removed" in _refused(cluster, namespace, "theirs", {"spec": {"managedBy": None}})

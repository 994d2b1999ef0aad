"""Issue 45 #1-#2 on one real control plane with the real Kueue: the two roles a DDPJob plays under MultiKueue.

- On the manager: spec.managedBy kueue.x-k8s.io/multikueue. The operator creates the job's Workload (owned by the
  job) and nothing else: no pod, Service or status, also once Kueue admits it; deleting the job deletes the Workload.
- In a worker cluster: the copy MultiKueue creates carries kueue.x-k8s.io/prebuilt-workload-name, naming the
  Workload MultiKueue made there first. The operator makes no Workload of its own, adopts that one (owner), and the
  copy's pods start when Kueue admits it.
Here one cluster plays both (MultiKueue itself, with three control planes, is tests/e2e's); the prebuilt Workload is
made as MultiKueue makes it: the manager's Workload, cloned with its labels and spec, without owner or status."""

from __future__ import annotations

import json
import time
from typing import Any

import yaml

from tests.conftest import Cluster, wait_for
from tests.integration.kueue_support import Kueue, job, pods_of
from tests.integration.operator_support import Jobs, OperatorProcess, Pool

PREBUILT = "kueue.x-k8s.io/prebuilt-workload-name"


def workloads(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "workloads.kueue.x-k8s.io", "-n", namespace, "-o", "json").stdout
    return sorted(json.loads(out)["items"], key=lambda w: w["metadata"]["name"])


def test_the_manager_makes_only_the_workload_and_a_worker_copy_runs_under_the_prebuilt_one(
    cluster: Cluster, namespace: str, operator: OperatorProcess, jobs: Jobs, pool: Pool, kq: Kueue
) -> None:
    pool.add(8)
    kq.apply(kq.flavor("a", namespace))
    kq.queues([("a", "6")])  # room for both jobs: this cluster's Kueue admits the manager's Workload too

    jobs.apply(job("mgr", 2, managedBy="kueue.x-k8s.io/multikueue"))
    wl = wait_for(lambda: kq.admitted("mgr") and kq.workload("mgr"), timeout=60,
                  describe="the manager job's Workload, admitted", state=lambda: jobs.describe("mgr"))
    (owner,) = wl["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("DDPJob", "mgr", True)
    time.sleep(3)  # a pass after the admission would have created its children by now
    assert pods_of(jobs, "mgr") == [] and "status" not in jobs.get("mgr")
    assert cluster.kubectl("get", "services,networkpolicies", "-n", namespace, "-l", "ddpjob.io/job-name=mgr",
                           "-o", "name").stdout.split() == []

    # The copy in a worker cluster: MultiKueue's Workload first (cloneForCreate: name, labels, spec), then the job.
    made = {"apiVersion": wl["apiVersion"], "kind": "Workload", "spec": wl["spec"],
            "metadata": {"name": "mk-made", "namespace": namespace,
                         "labels": {**wl["metadata"]["labels"], "ddpjob.io/job-name": "copy"}}}
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(made))
    copy = job("copy", 2)
    copy["metadata"]["labels"][PREBUILT] = "mk-made"
    jobs.apply(copy)
    jobs.running("copy", 2, timeout=90)
    mine = [w for w in workloads(cluster, namespace) if w["metadata"]["labels"].get("ddpjob.io/job-name") == "copy"]
    assert [w["metadata"]["name"] for w in mine] == ["mk-made"], "a second Workload for the copy"
    (owner,) = mine[0]["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("DDPJob", "copy", jobs.get("copy")["metadata"]["uid"])
    assert jobs.condition("copy", "Admitted") is not None

    cluster.kubectl("delete", "ddpjob", "mgr", "-n", namespace)
    wait_for(lambda: kq.workload("mgr") is None, timeout=60, describe="the manager's Workload gone with its job")

"""Kueue in the local control plane (tests/cluster/kueue.py): the real manager queues suspended Jobs against a
ClusterQueue's quota, admits what fits and the next one once quota frees; its webhooks (validation, CRD conversion)
answer the apiserver."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import Cluster, wait_for

KUEUE = "kueue.x-k8s.io/v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def _items(cluster: Cluster, kind: str, namespace: str, *args: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", kind, "-n", namespace, *args, "-o", "json").stdout
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def _conditions(obj: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c.get("message", "")) for c in (obj.get("status") or {}).get("conditions", [])}


@pytest.fixture
def queue(cluster: Cluster, namespace: str) -> Iterator[str]:
    """LocalQueue `q` in the test's namespace, on a ClusterQueue with 2 CPUs of quota for every namespace (it and
    its ResourceFlavor are cluster-scoped: named after the namespace, deleted after the test)."""
    name = namespace
    flavor = {"name": name, "resources": [{"name": "cpu", "nominalQuota": 2}]}
    quota = {"coveredResources": ["cpu"], "flavors": [flavor]}
    objects = [
        {"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": name}},
        {"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": name},
         "spec": {"namespaceSelector": {}, "resourceGroups": [quota]}},
        {"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": {"name": "q", "namespace": namespace},
         "spec": {"clusterQueue": name}},
    ]
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    try:
        yield "q"
    finally:
        cluster.kubectl("delete", "clusterqueue", name, "--wait=false", check=False)
        cluster.kubectl("delete", "resourceflavor", name, "--wait=false", check=False)


def _job(name: str, queue: str) -> dict[str, Any]:
    """A Job Kueue manages: created suspended, in a queue, asking for the ClusterQueue's whole quota."""
    container = {"name": "main", "image": "busybox:never-pulled", "resources": {"requests": {"cpu": "2"}}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
            "spec": {"suspend": True, "template": {"spec": {"restartPolicy": "Never", "containers": [container]}}}}


def _admitted_and_pending(cluster: Cluster, namespace: str) -> tuple[list[str], list[str]]:
    """Jobs whose Workload Kueue admitted, and those whose Workload waits for quota."""
    admitted, pending = [], []
    for wl in _items(cluster, "workloads.kueue.x-k8s.io", namespace):
        job = wl["metadata"]["ownerReferences"][0]["name"]
        conditions = _conditions(wl)
        if conditions.get("Admitted", ("",))[0] == "True":
            admitted.append(job)
        elif "insufficient unused quota" in conditions.get("QuotaReserved", ("", ""))[1]:
            pending.append(job)
    return admitted, pending


def _running_on_kwok(cluster: Cluster, namespace: str, job: str) -> bool:
    pods = _items(cluster, "pods", namespace, "-l", f"job-name={job}")
    return any(p["status"].get("phase") == "Running" and p["spec"].get("nodeName", "").startswith("kwok-")
               for p in pods)


def test_kueue_admits_within_quota_and_the_next_job_once_quota_frees(
        cluster: Cluster, namespace: str, queue: str) -> None:
    for name in ("first", "second"):
        cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(_job(name, queue)))
    state = lambda: cluster.kubectl("get", "workloads,jobs,pods", "-n", namespace, "-o", "wide").stdout  # noqa: E731

    def one_admitted_one_pending() -> tuple[str, str] | None:
        admitted, pending = _admitted_and_pending(cluster, namespace)
        return (admitted[0], pending[0]) if len(admitted) == 1 and len(pending) == 1 else None

    admitted, pending = wait_for(one_admitted_one_pending, timeout=30, state=state,
                                 describe="a Workload per Job, one admitted and one pending for quota")
    wait_for(lambda: _running_on_kwok(cluster, namespace, admitted), timeout=30, state=state,
             describe=f"Kueue to unsuspend Job {admitted} and its pod Running on a kwok node")
    held = json.loads(cluster.kubectl("get", "job", pending, "-n", namespace, "-o", "json").stdout)
    assert held["spec"]["suspend"] is True
    assert not _items(cluster, "pods", namespace, "-l", f"job-name={pending}")

    cluster.kubectl("delete", "job", admitted, "-n", namespace)
    wait_for(lambda: _admitted_and_pending(cluster, namespace)[0] == [pending], timeout=30, state=state,
             describe=f"Kueue to admit Job {pending} once {admitted}'s quota is released")
    wait_for(lambda: _running_on_kwok(cluster, namespace, pending), timeout=30, state=state,
             describe=f"Job {pending}'s pod Running")


def test_kueue_webhooks_validate_and_convert(cluster: Cluster, namespace: str, queue: str) -> None:
    bad = {"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": f"{namespace}-bad"},
           "spec": {"resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
               {"name": namespace, "resources": [{"name": "cpu", "nominalQuota": "-1"}]}]}]}}
    proc = cluster.kubectl("create", "--dry-run=server", "-f", "-", stdin=json.dumps(bad), check=False)
    assert proc.returncode != 0
    # Kueue's validating webhook, not the CRD's schema: the schema allows a negative quantity.
    assert 'admission webhook "vclusterqueue.kb.io" denied the request' in proc.stderr, proc.stderr
    assert "nominalQuota: Invalid value: \"-1\": must be greater than or equal to 0" in proc.stderr, proc.stderr

    # Stored as v1beta2; read as v1beta1 the apiserver asks Kueue's conversion webhook.
    old = cluster.kubectl("get", "localqueues.v1beta1.kueue.x-k8s.io", queue, "-n", namespace, "-o", "json").stdout
    assert json.loads(old)["apiVersion"] == "kueue.x-k8s.io/v1beta1"
    assert json.loads(old)["spec"]["clusterQueue"] == namespace

"""Kueue objects for the integration tests: this test's ResourceFlavors, ClusterQueue, LocalQueue and
WorkloadPriorityClasses (named after its namespace, deleted after it: conftest.py's ``kq``), and queued jobs."""

from __future__ import annotations

import json
from typing import Any

import yaml

from tests.conftest import Cluster
from tests.integration.operator_support import POOL_LABEL, Jobs, small_job

QUEUE = "kueue.x-k8s.io/queue-name"
PRIORITY = "kueue.x-k8s.io/priority-class"
V = "kueue.x-k8s.io/v1beta2"


class Kueue:
    """This test's ResourceFlavors, ClusterQueue, LocalQueue and WorkloadPriorityClasses, deleted after it."""

    def __init__(self, cluster: Cluster, ns: str) -> None:
        self.cluster, self.ns = cluster, ns
        self.cluster_scoped: list[str] = []

    def apply(self, *objs: dict[str, Any]) -> None:
        self.cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(objs))
        self.cluster_scoped += [f"{o['kind'].lower()}/{o['metadata']['name']}" for o in objs
                                if "namespace" not in o["metadata"]]

    def flavor(self, name: str, pool: str) -> dict[str, Any]:
        return {"apiVersion": V, "kind": "ResourceFlavor", "metadata": {"name": f"{self.ns}-{name}"},
                "spec": {"nodeLabels": {POOL_LABEL: pool},
                         "tolerations": [{"key": POOL_LABEL, "operator": "Equal", "value": pool,
                                          "effect": "NoSchedule"}]}}

    def queues(self, quotas: list[tuple[str, str]], **spec: Any) -> None:
        """A ClusterQueue over (flavor, cpu quota) in order, memory plentiful, and LocalQueue ``q``."""
        flavors = [{"name": f"{self.ns}-{f}", "resources": [{"name": "cpu", "nominalQuota": cpu},
                                                             {"name": "memory", "nominalQuota": "1Ti"}]}
                   for f, cpu in quotas]
        self.apply({"apiVersion": V, "kind": "ClusterQueue", "metadata": {"name": self.ns},
                    "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.ns}},
                             "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": flavors}],
                             **spec}},
                   {"apiVersion": V, "kind": "LocalQueue", "metadata": {"name": "q", "namespace": self.ns},
                    "spec": {"clusterQueue": self.ns}})

    def priority(self, name: str, value: int) -> str:
        full = f"{self.ns}-{name}"
        self.apply({"apiVersion": V, "kind": "WorkloadPriorityClass", "metadata": {"name": full}, "value": value})
        return full

    def workload(self, job: str) -> dict[str, Any] | None:
        out = self.cluster.kubectl("get", "workloads.kueue.x-k8s.io", "-n", self.ns, "-l",
                                   f"ddpjob.io/job-name={job}", "-o", "json").stdout
        items = json.loads(out)["items"]
        return items[0] if items else None

    def admitted(self, job: str) -> bool:
        wl = self.workload(job)
        return wl is not None and any(c["type"] == "Admitted" and c["status"] == "True"
                                      for c in wl.get("status", {}).get("conditions", []))

    def delete(self) -> None:
        self.cluster.kubectl("delete", "ddpjobs", "--all", "-n", self.ns, "--wait=false", check=False)
        if self.cluster_scoped:
            self.cluster.kubectl("delete", *reversed(self.cluster_scoped), "--wait=false", check=False)


def job(name: str, replicas: int, *, queue: str | None = "q", priority: str | None = None,
        **spec: Any) -> dict[str, Any]:
    # A claim: a job in a queue can be preempted, and keeps its checkpoints on it (refused without one).
    body = small_job(name, replicas, checkpoint={"volumeClaim": {"size": "1Gi"}}, **spec)
    body["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1", "memory": "1Gi"}}
    labels = {**({QUEUE: queue} if queue else {}), **({PRIORITY: priority} if priority else {})}
    body["metadata"]["labels"] = labels
    return body


def pods_of(jobs: Jobs, name: str) -> list[dict[str, Any]]:
    return jobs.live_pods(name) + jobs.live_pods(name, kind="rendezvous")

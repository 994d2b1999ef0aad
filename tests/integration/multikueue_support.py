"""MultiKueue as a platform team sets it up (docs/scheduling.md, "More than one cluster"), for the tests that run it
on real control planes (tests/integration/test_multikueue.py, tests/e2e/test_multikueue.py): the chart's RBAC in each
role, and on the manager a Secret with each worker's kubeconfig (the token of a ServiceAccount whose only DDPJob
rights are the chart's `multiKueue.worker` grant), the MultiKueueClusters, a MultiKueueConfig, the AdmissionCheck and
a ClusterQueue that asks for it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from tests.conftest import Cluster, wait_for
from tests.integration.helm import CHART, RELEASE, Helm
from tests.integration.kueue_support import Kueue, V
from tests.integration.operator_support import EXAMPLES

MULTIKUEUE = "kueue.x-k8s.io/multikueue"
KUEUE_NAMESPACE = "kueue-system"


@dataclass
class WorkerCluster:
    """A worker cluster as the manager knows it: its MultiKueueCluster's name and how to reach it."""

    name: str
    cluster: Cluster


def chart_roles(cluster: Cluster, role: str) -> None:
    """The chart's RBAC for Kueue's MultiKueue in ``role`` (manager or worker), as `helm install --set
    multiKueue.<role>.enabled=true` would create it."""
    out = Helm(cluster)("template", RELEASE, str(CHART), "--kube-version=1.30.0", "--show-only",
                        "templates/multikueue.yaml", "--set", f"multiKueue.{role}.enabled=true").stdout
    cluster.kubectl("apply", "-f", "-", stdin=out)


def worker_kubeconfig(w: WorkerCluster) -> str:
    """The kubeconfig MultiKueue reaches worker ``w`` with: its server and CA, and the token of manifests/examples/
    multikueue/worker-access.yaml's ServiceAccount, whose DDPJob rights are the chart's (not the cluster admin's)."""
    w.cluster.kubectl("apply", "-n", KUEUE_NAMESPACE, "-f", str(EXAMPLES / "multikueue" / "worker-access.yaml"))
    chart_roles(w.cluster, "worker")
    token = w.cluster.kubectl("create", "token", "multikueue-sa", "-n", KUEUE_NAMESPACE, "--duration=1h").stdout
    flat = yaml.safe_load(w.cluster.kubectl("config", "view", "--raw", "--flatten", "--minify").stdout)
    flat["users"] = [{"name": "multikueue-sa", "user": {"token": token.strip()}}]
    flat["contexts"][0]["context"]["user"] = "multikueue-sa"
    return yaml.safe_dump(flat)


def connect(cluster: Cluster, kq: Kueue, namespace: str, workers: Sequence[WorkerCluster], *,
            flavor: dict[str, Any] | None = None) -> None:
    """The manager's side: a Secret with each worker's kubeconfig, MultiKueueClusters, a MultiKueueConfig, the
    AdmissionCheck, and a ClusterQueue that asks for it, over ``flavor`` (default: flavor `a` of the test's kwok
    pool; its name must be `<namespace>-a`)."""
    chart_roles(cluster, "manager")
    for w in workers:
        flat = worker_kubeconfig(w)
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": w.name, "namespace": KUEUE_NAMESPACE},
                  "stringData": {"kubeconfig": flat}}
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(secret))
    kq.apply(*[{"apiVersion": V, "kind": "MultiKueueCluster", "metadata": {"name": w.name},
                "spec": {"clusterSource": {"kubeConfig": {"location": w.name, "locationType": "Secret"}}}}
               for w in workers],
             {"apiVersion": V, "kind": "MultiKueueConfig", "metadata": {"name": namespace},
              "spec": {"clusters": [w.name for w in workers]}},
             {"apiVersion": V, "kind": "AdmissionCheck", "metadata": {"name": namespace},
              "spec": {"controllerName": MULTIKUEUE, "parameters": {
                  "apiGroup": "kueue.x-k8s.io", "kind": "MultiKueueConfig", "name": namespace}}},
             flavor or kq.flavor("a", namespace))
    kq.queues([("a", "100")], admissionChecksStrategy={"admissionChecks": [{"name": namespace}]})

    def active(kind: str, name: str) -> bool:
        obj = json.loads(cluster.kubectl("get", kind, name, "-o", "json").stdout)
        return any(c["type"] == "Active" and c["status"] == "True" for c in obj.get("status", {}).get("conditions", []))

    for w in workers:
        wait_for(lambda w=w: active("multikueueclusters.kueue.x-k8s.io", w.name), timeout=60,  # type: ignore[misc]
                 describe=f"MultiKueueCluster {w.name} Active",
                 state=lambda w=w: cluster.kubectl("get", "multikueueclusters.kueue.x-k8s.io", w.name, "-o",  # type: ignore[misc]
                                                   "yaml").stdout)
    wait_for(lambda: active("admissionchecks.kueue.x-k8s.io", namespace), timeout=60,
             describe=f"AdmissionCheck {namespace} Active")

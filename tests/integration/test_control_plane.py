"""The local control plane is real Kubernetes: API server validation, scheduling, controllers, GC, kwok pods."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cluster, wait_for

CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.probe.ddpjob.io}
spec:
  group: probe.ddpjob.io
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [size]
            properties:
              size: {type: integer, minimum: 1, maximum: 10}
"""


def _json(cluster: Cluster, *args: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(cluster.kubectl(*args, "-o", "json").stdout)
    return data


def test_server_is_the_pinned_kubernetes_version(cluster: Cluster) -> None:
    from tests.cluster.controlplane import versions

    info = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert info["serverVersion"]["gitVersion"] == versions()["KUBERNETES_VERSION"]
    nodes = _json(cluster, "get", "nodes")["items"]
    ready = [n["metadata"]["name"] for n in nodes if any(
        c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])]
    assert len(ready) >= 4, f"expected >= 4 Ready kwok nodes, got {ready}"
    assert all(n["status"]["capacity"].get("nvidia.com/gpu") for n in nodes)


def test_crd_custom_object_and_schema_rejection(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-f", "-", stdin=CRD)
    wait_for(
        lambda: any(c["type"] == "Established" and c["status"] == "True"
                    for c in _json(cluster, "get", "crd", "widgets.probe.ddpjob.io")["status"].get("conditions", [])),
        timeout=30, describe="CRD widgets.probe.ddpjob.io Established",
    )
    good = "apiVersion: probe.ddpjob.io/v1\nkind: Widget\nmetadata: {name: w}\nspec: {size: 3}\n"
    # Discovery can lag the Established condition by a moment; retry the create until the kind is known.
    wait_for(lambda: cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=good, check=False).returncode == 0,
             timeout=30, describe="creating a Widget")
    assert _json(cluster, "get", "widget", "w", "-n", namespace)["spec"]["size"] == 3

    bad = "apiVersion: probe.ddpjob.io/v1\nkind: Widget\nmetadata: {name: bad}\nspec: {size: 99}\n"
    proc = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=bad, check=False)
    assert proc.returncode != 0
    assert "spec.size" in proc.stderr and "less than or equal to 10" in proc.stderr, proc.stderr
    # Server-side dry-run persisted nothing.
    assert cluster.kubectl("get", "widget", "bad", "-n", namespace, check=False).returncode != 0


def test_deployment_pod_is_scheduled_onto_a_kwok_node_and_runs(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("create", "deployment", "web", "--image=nginx:never-pulled", "-n", namespace)

    def running_pod() -> dict[str, Any] | None:
        pods = _json(cluster, "get", "pods", "-n", namespace, "-l", "app=web")["items"]
        return next((p for p in pods if p["status"].get("phase") == "Running"), None)

    pod = wait_for(running_pod, timeout=60, describe="the Deployment's pod Running",
                   state=lambda: cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide").stdout)
    assert pod["spec"]["nodeName"].startswith("kwok-node-")
    assert pod["status"]["podIP"]


def test_owned_child_is_garbage_collected(cluster: Cluster, namespace: str) -> None:
    owner = _json(cluster, "create", "configmap", "owner", "-n", namespace)
    child = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "child", "namespace": namespace, "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}]},
    }
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(child))
    cluster.kubectl("delete", "configmap", "owner", "-n", namespace)
    wait_for(lambda: cluster.kubectl("get", "configmap", "child", "-n", namespace, check=False).returncode != 0,
             timeout=60, describe="the garbage collector to delete the owned child")


@pytest.mark.parametrize("code", [137])
def test_pod_driven_to_failed_with_exit_code(cluster: Cluster, namespace: str, code: int) -> None:
    cluster.kubectl("run", "victim", "--image=busybox:never-pulled", "--restart=Never", "-n", namespace)
    wait_for(lambda: _json(cluster, "get", "pod", "victim", "-n", namespace)["status"].get("phase") == "Running",
             timeout=60, describe="pod victim Running")
    cluster.kubectl("annotate", "pod", "victim", "-n", namespace, f"ddpjob.test/exit-code={code}",
                    "ddpjob.test/termination-message=killed by test")

    def failed() -> dict[str, Any] | None:
        pod = _json(cluster, "get", "pod", "victim", "-n", namespace)
        return pod if pod["status"].get("phase") == "Failed" else None

    pod = wait_for(failed, timeout=60, describe="pod victim Failed",
                   state=lambda: cluster.kubectl("get", "pod", "victim", "-n", namespace, "-o", "yaml").stdout)
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == code
    assert term["message"] == "killed by test"


def test_pod_succeeds_on_request(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("run", "done", "--image=busybox:never-pulled", "--restart=Never", "-n", namespace)
    wait_for(lambda: _json(cluster, "get", "pod", "done", "-n", namespace)["status"].get("phase") == "Running",
             timeout=60, describe="pod done Running")
    cluster.kubectl("annotate", "pod", "done", "-n", namespace, "ddpjob.test/succeed=true")
    wait_for(lambda: _json(cluster, "get", "pod", "done", "-n", namespace)["status"].get("phase") == "Succeeded",
             timeout=60, describe="pod done Succeeded")



def test_a_plain_control_plane_runs_no_kueue_and_no_scheduler_plugins(tmp_path: Path) -> None:
    """`make demo`'s cluster (addons=False, issue 44): neither process started nor its tool asked for, and their
    API groups not served; pods still schedule (the default scheduler, a kwok node)."""
    from tests.cluster import gang_scheduler, kueue
    from tests.cluster.controlplane import down, up

    directory = tmp_path / "plain"
    try:
        state = up(directory, addons=False)
        plain = Cluster(state.kubeconfig)
        assert {kueue.NAME, gang_scheduler.NAME}.isdisjoint(state.pids), f"started: {sorted(state.pids)}"
        groups = plain.kubectl("api-versions").stdout.split()
        assert not [g for g in groups if g.startswith(("kueue.x-k8s.io", "scheduling.x-k8s.io"))], groups
        plain.kubectl("run", "probe", "--image=probe", "--restart=Never")
        wait_for(lambda: plain.kubectl("get", "pod", "probe", "-o", "jsonpath={.spec.nodeName}").stdout,
                 timeout=60, describe="the probe pod scheduled to a kwok node")
    finally:
        down(directory, quiet=True)

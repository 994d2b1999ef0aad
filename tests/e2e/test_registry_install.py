"""Issue 44 #3, the way a platform team installs it: the images and the chart published to an OCI registry (CNCF
distribution's `registry`, its certificate from the cluster CA: tests/cluster/registry.py), then `helm install
oci://...` with the one value `imageRegistry`, the real nodes' containerd pulling the operator and runtime images
from that registry (nothing imported beside it), and a job trained to Succeeded. The job's own training image stays
the one imported into the nodes, as a user's own image in their own registry would be: the chart deploys the
operator and injects the runtime, and those two are what this install must bring.

Last in the session (marker ``uninstalls``), after tests/e2e/test_install.py: it removes the session's Helm release
and the CRD first."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.node import NodeState
from tests.cluster.registry import Registry
from tests.conftest import Cluster
from tests.e2e import training as t
from tests.e2e.background import Background
from tests.e2e.runs import Env, fresh_namespace

pytestmark = pytest.mark.timeout(900)

PATH = "ml/team"  # a path under the host, as registry.example.com/ml/team
CHART_VERSION = next(line.split(":", 1)[1].strip().strip('"') for line in (t.CHART / "Chart.yaml").read_text()
                     .splitlines() if line.startswith("version:"))
#: A short run: this test is about where the images come from, not about training (every other test is).
ARGS = ["python", "-m", "ddpjob_worker.examples.charlm", "--epochs", "1", "--steps-per-epoch", "12",
        "--batch-size", "16", "--d-model", "64", "--checkpoint-every", "4", "--log-every", "1", "--seed", "1234"]


def _run(*argv: str, timeout: float = 300, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, cwd=t.REPO, env=env)
    assert proc.returncode == 0, (f"{' '.join(argv)}: exit {proc.returncode}\n"
                                  f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


@pytest.fixture
def registry(env: Env, tmp_path: Path) -> Iterator[Registry]:
    cluster_dir = Path(env.cluster.kubeconfig).resolve().parent
    if NodeState.load(cluster_dir) is None:
        pytest.skip("needs the local real nodes: their containerd is told to trust the registry by files here")
    reg = Registry.start(cluster_dir, tmp_path / "registry")
    try:
        yield reg
    finally:
        reg.untrust_on_nodes(cluster_dir)
        reg.stop()


def _publish(reg: Registry, tmp_path: Path) -> None:
    """`REGISTRY=... make push` (operator and runtime: the ~6 GB worker image is a job's own) and `helm push`."""
    pushed = f"{reg.push_host}/{PATH}"
    out = _run("make", "--no-print-directory", "push", env={**os.environ, "REGISTRY": pushed,
                                                            "IMAGES": "operator runtime"}, timeout=600)
    t.log(f"make push to {pushed}: {out.strip().splitlines()[-1]}")
    for image in ("ddpjob-operator", "ddpjob-runtime"):  # only the tag: the image stays under its own names
        subprocess.run(["docker", "rmi", f"{pushed}/{image}:{t.APP_VERSION}"], capture_output=True, check=False)
    _run(t.helm(), "package", str(t.CHART), "-d", str(tmp_path))
    _run(t.helm(), "push", str(tmp_path / f"ddpjob-operator-{CHART_VERSION}.tgz"), f"oci://{pushed}/charts",
         "--plain-http")


def _node_images(cluster_dir: Path) -> dict[str, set[str]]:
    """Each real node's image references, by node name (its containerd's own list)."""
    ns = NodeState.load(cluster_dir.resolve())
    assert ns is not None
    return {ns.name_of(k): set(_run("ctr", "--address", str(ns.socket_of(k)), "--namespace", "k8s.io", "images",
                                    "ls", "-q").split()) for k in range(ns.nodes)}


def _pods(cluster: Cluster, ns: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(cluster.kubectl("get", "pods", "-n", ns, "-o", "json").stdout)["items"]
    return items


@pytest.mark.uninstalls
def test_helm_install_from_oci_with_one_value_pulls_from_the_registry_and_trains(
    env: Env, background: Background, registry: Registry, tmp_path: Path
) -> None:
    background.drain()
    cluster = env.cluster
    t.remove_helm_install(cluster)
    _publish(registry, tmp_path)

    source = f"{registry.tls_host}/{PATH}"
    t0 = time.monotonic()
    _run(t.helm(), "install", t.RELEASE, f"oci://{source}/charts/ddpjob-operator", "--version", CHART_VERSION,
         "--ca-file", str(registry.ca), "--kubeconfig", str(cluster.kubeconfig), "-n", t.OPERATOR_NS,
         "--create-namespace", "--set", f"imageRegistry={source}", "--wait", "--timeout", "5m")
    t.log(f"helm install oci://{source}/charts/ddpjob-operator --set imageRegistry={source}: Ready in "
          f"{time.monotonic() - t0:.0f}s")
    ns = fresh_namespace(cluster, "registry")
    try:
        name = "from-registry"
        job = t.ddpjob_manifest(name, ns, node_selector=env.node_selector, claim=False, args=ARGS)
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(job))
        status = t.wait_job_state(cluster, ns, name, "Succeeded", timeout=600)
        t.log(f"{name}: Succeeded at global step {(status.get('progress') or {}).get('globalStep')}")

        # What ran came from the registry, and each node that ran it holds it under the registry's name.
        cluster_dir = Path(cluster.kubeconfig).resolve().parent
        held = _node_images(cluster_dir)
        refs: dict[str, set[str]] = {}
        for pod in [*_pods(cluster, t.OPERATOR_NS), *_pods(cluster, ns)]:
            spec = pod["spec"]
            for c in [*spec.get("initContainers", []), *spec["containers"]]:
                if c["image"].startswith(f"{source}/"):
                    refs.setdefault(c["image"], set()).add(spec["nodeName"])
        assert f"{source}/ddpjob-operator:{t.APP_VERSION}" in refs, refs
        assert f"{source}/ddpjob-runtime:{t.APP_VERSION}" in refs, refs
        for ref, nodes in refs.items():
            for node in nodes:
                assert ref in held[node], f"{node}'s containerd has no {ref}: {sorted(held[node])}"
        t.log(f"pulled from {source}: " + ", ".join(f"{ref.rsplit('/', 1)[-1]} on {len(n)} node(s)"
                                                   for ref, n in sorted(refs.items())))
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        t.remove_helm_install(cluster)

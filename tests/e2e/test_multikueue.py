"""Issue 45 on real nodes: a lost worker cluster's job resumes in the other from the object store.

Three control planes of its own (not the session's cluster): a manager whose Kueue runs MultiKueue, worker A with two
real nodes, and worker B, whose two real nodes join once A is gone. A DDPJob submitted to the manager (managedBy
MultiKueue, spec.checkpoint.objectStore on a real S3 server, no claim) runs in A and uploads its checkpoints. Then A
is stopped, its API server and nodes (its trainers die with them): past MultiKueue's workerLostTimeout the manager's
Workload is evicted and dispatched to B, where the operator's new copy resumes every rank from the newest uploaded
checkpoint and the run ends bitwise equal to an uninterrupted one.

Why B's nodes join late: this machine runs one real-node cluster at a time (node 0 lives in the host's network
namespace, its bridge holds the apiserver's, CoreDNS's and the store's address: tests/cluster/node.py), so B's
control plane, Kueue and operator run from the start and its nodes come up as A's go. The seconds from the loss to
B's copy and pods are the product's; from B's nodes ready to the first step is what a cluster whose nodes already
exist would add; both are recorded (docs/scheduling.md quotes them). Extended tier (`make e2e-extended`): it needs
the machine's real-node slot before the session cluster takes it (tests/e2e/conftest.py orders it first)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cluster, wait_for
from tests.e2e import faults, objectstores, results
from tests.e2e import training as t
from tests.e2e.conftest import REAL_NODE_LABEL
from tests.e2e.hostcheck import HostSnapshot
from tests.e2e.runs import JOB, create_namespace
from tests.integration.kueue_support import Kueue, V
from tests.integration.multikueue_support import MULTIKUEUE, WorkerCluster, connect
from tests.integration.operator_support import CRD_PATH, OperatorProcess

pytestmark = [pytest.mark.timeout(2400), pytest.mark.extended, pytest.mark.own_real_nodes]

STEP_UNIT = re.compile(r"step-(\d+)$")
#: The e2e session's images (the plain one unused here): the nodes' saved copy is then the one `make e2e` restores
#: (tests/cluster/node_images.py keeps one), and B takes A's in seconds.
IMAGES = [*t.NODE_IMAGES, t.PLAIN_IMAGE]
IMPORTING = "ddpjob.io/importing-images"


@dataclass
class Clusters:
    manager: Cluster
    a: Cluster
    b: Cluster
    dirs: dict[str, Path]
    store: Any  # tests.cluster.objectstore.S3Server
    ca: Path


@pytest.fixture
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clusters]:
    """The three control planes (A with its real nodes and the e2e images), the S3 server on the bridge address
    (serving on every address, so it outlives A's bridge: B's nodes bring the address back); all torn down after,
    and nothing of the real nodes left on the host."""
    from tests.cluster.controlplane import down, up
    from tests.cluster.node import NODE_IP
    from tests.cluster.objectstore import S3Server
    from tests.cluster.pki import make_pki, serving_cert

    base = tmp_path_factory.mktemp("mk")
    dirs = {name: base / name for name in ("m", "a", "b")}
    before = HostSnapshot.take(base)
    server = None
    try:
        up(dirs["m"])
        up(dirs["a"], real_node=True, nodes=2)
        up(dirs["b"], nodes_later=True)
        for d in dirs.values():
            Cluster(d / "kubeconfig").kubectl("apply", "--server-side", "-f", str(CRD_PATH))
        t.import_images(dirs["a"], IMAGES)
        make_pki(base / "s3-pki")
        # Loopback too: the test reads the bucket while no bridge exists (between A's nodes and B's).
        cert, key = serving_cert(base / "s3-pki", "objectstore", (f"IP:{NODE_IP}", "IP:127.0.0.1"))
        server = S3Server.start(base / "s3", host=NODE_IP, tls=(cert, key), ca=base / "s3-pki" / "ca.crt",
                                outlive_bridge=True)
        m, a, b = (Cluster(dirs[n] / "kubeconfig") for n in ("m", "a", "b"))
        yield Clusters(m, a, b, dirs, server, base / "s3-pki" / "ca.crt")
    finally:
        if server is not None:
            server.stop()
        for d in reversed(dirs.values()):
            down(d, quiet=True)
        left = HostSnapshot.take(base).left_since(before)
        assert not left, f"the real nodes left things behind after down: {left}"


def _namespace(c: Clusters, ns: str) -> None:
    """The namespace in every cluster, with the store's Secret and CA: MultiKueue copies the job, not what it
    references, so a platform team keeps these in every worker (docs/scheduling.md)."""
    items = objectstores.store_objects(c.store, c.ca, ns)
    for cluster in (c.manager, c.a, c.b):
        create_namespace(cluster, ns)
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))


def _uploaded_steps(c: Clusters, store: dict[str, Any], ns: str) -> list[int]:
    """The steps of the job's checkpoints in the store, read over loopback (the bridge comes and goes)."""
    from tests.cluster.node import NODE_IP

    client = c.store.client(endpoint_url=c.store.endpoint.replace(NODE_IP, "127.0.0.1"))
    return sorted(int(m[1]) for n in objectstores.uploaded(store, ns, JOB, client) if (m := STEP_UNIT.search(n)))


def _created(cluster: Cluster, ns: str, *what: str) -> float:
    """The earliest creationTimestamp of ``what`` (kubectl get arguments) in ``ns``."""
    items = json.loads(cluster.kubectl("get", *what, "-n", ns, "-o", "json").stdout)
    items = items.get("items", [items])
    return min(t.parse_ts(i["metadata"]["creationTimestamp"]) for i in items)


def _status(cluster: Cluster, ns: str) -> dict[str, Any]:
    return t.job_status(cluster, ns, JOB)


def test_a_lost_worker_cluster_s_job_resumes_in_the_other_from_the_object_store(clusters: Clusters,
                                                                               tmp_path: Path) -> None:
    c, ns = clusters, f"e2e-mk-{int(time.time()) % 100000}"
    store = objectstores.store_spec(c.store, c.store.bucket(ns))
    _namespace(c, ns)
    flavor = {"apiVersion": V, "kind": "ResourceFlavor", "metadata": {"name": f"{ns}-a"}}  # no node labels: real
    kq = {name: Kueue(cluster, ns) for name, cluster in (("m", c.manager), ("a", c.a), ("b", c.b))}
    for name in ("a", "b"):
        kq[name].apply(flavor)
        kq[name].queues([("a", "6" if name == "a" else "0")])  # B gets room once A runs the job
    workers = [WorkerCluster(f"{ns}-a", c.a), WorkerCluster(f"{ns}-b", c.b)]
    runtime = ("--runtime-image", t.RUNTIME_IMAGE)
    ops = {name: OperatorProcess(cluster, ns, tmp_path, name=name, extra_args=runtime)
           for name, cluster in (("m", c.manager), ("a", c.a), ("b", c.b))}
    try:
        for op in ops.values():
            op.start()
        connect(c.manager, kq["m"], ns, workers, flavor=flavor)
        _run(c, ns, store, kq, ops["a"], workers)
    finally:
        for op in ops.values():
            op.stop()


def _run(c: Clusters, ns: str, store: dict[str, Any], kq: dict[str, Kueue], op_a: OperatorProcess,
         workers: list[WorkerCluster]) -> None:
    """Submit, train in A to an upload of step 20, lose A, bring B's nodes, and check B's resumed run (the numbers
    go to the e2e summary)."""
    from tests.cluster.kueue import WORKER_LOST_TIMEOUT

    manifest = t.ddpjob_manifest(JOB, ns, node_selector={REAL_NODE_LABEL: "true"}, claim=False,
                                 checkpoint={"objectStore": store}, labels={"kueue.x-k8s.io/queue-name": "q"})
    manifest["spec"]["managedBy"] = MULTIKUEUE
    c.manager.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
    submitted = time.monotonic()
    t.log(f"multikueue: DDPJob {ns}/{JOB} submitted to the manager")
    wait_for(lambda: max(_uploaded_steps(c, store, ns), default=0) >= 20
             and t.job_status(c.a, ns, JOB).get("state") == "Running",
             timeout=600, interval=2, describe="the job Running in A with checkpoint step-20 uploaded",
             state=lambda: t.describe_job(c.a, ns, JOB) + "\n" + t.describe_job(c.manager, ns, JOB))
    assert not c.b.kubectl("get", "ddpjob", JOB, "-n", ns, "--ignore-not-found", "-o", "name").stdout.strip()
    kq["b"].queues([("a", "6")])
    wait_for(lambda: _status(c.manager, ns).get("state") == "Running", timeout=60, describe="Running on the manager",
             state=lambda: json.dumps(_status(c.manager, ns)))

    lost, uploaded = _lose_a(c, ns, store, op_a)
    nodes_ready = _nodes_for_b(c)
    t.log(f"multikueue: B's real nodes ready with the images {nodes_ready - lost:.1f}s after the loss")
    wait_for(lambda: sum(p["status"].get("phase") == "Running" for p in t.worker_pods(c.b, ns, JOB)
                         if p["metadata"]["labels"].get("ddpjob.io/replica-type") == "worker") == 2,
             timeout=300, describe="the copy's two workers Running in B",
             state=lambda: t.describe_job(c.manager, ns, JOB) + "\n" + t.describe_job(c.b, ns, JOB))
    # MultiKueue deletes the copy, and so its pods, once it has finished: read them now, and follow the logs.
    copy_at = _created(c.b, ns, "ddpjob", JOB)
    pods_at = _created(c.b, ns, "pods", "-l", f"ddpjob.io/job-name={JOB}")
    capture = faults.LogCapture(c.b, ns)
    with capture.followed():
        home = wait_for(lambda: (s := _status(c.manager, ns)).get("state") == "Succeeded" and s, timeout=900,
                        interval=1, describe="Succeeded (on the manager, from B's copy)",
                        state=lambda: json.dumps(_status(c.manager, ns)))
    wall = time.monotonic() - submitted
    logs = t.RunLogs.collect(c.b, ns, JOB, capture.texts)
    wl = kq["m"].workload(JOB)
    assert wl is not None and (wl.get("status") or {}).get("clusterName") == workers[1].name, wl
    resumed: dict[str, int] = {}
    for _, pod, step in logs.resumes(lost):
        resumed.setdefault(pod, step)  # each pod's first resume (a restart in B would add later ones)
    first = logs.first_step_after(lost)
    row = {"workerLostTimeout": WORKER_LOST_TIMEOUT, "uploaded_before_loss": uploaded,
           "resumed": sorted(set(resumed.values())), "loss_to_copy_in_b_s": round(copy_at - lost, 1),
           "loss_to_pods_in_b_s": round(pods_at - lost, 1), "loss_to_nodes_ready_s": round(nodes_ready - lost, 1),
           "nodes_ready_to_first_step_s": round(first - nodes_ready, 1) if first else None,
           "loss_to_first_step_s": round(first - lost, 1) if first else None,
           "incidents": home.get("incidentCount", 0), "wall_seconds": round(wall, 1),
           "params": (logs.final_digest() or "")[:16]}
    results.record("multikueue-lost-cluster", **row)
    t.log(f"multikueue lost cluster: {row}")
    assert len(resumed) == 2 and len(set(resumed.values())) == 1, f"every rank from one checkpoint: {resumed}"
    assert min(resumed.values()) >= uploaded > 0, f"resumed before the last upload ({uploaded}): {resumed}"
    _same_as_uninterrupted(c, ns, logs.final_digest())


def _lose_a(c: Clusters, ns: str, store: dict[str, Any], op_a: OperatorProcess) -> tuple[float, int]:
    """A's operator, nodes (every container on them) and control plane stopped, all at once; returns when that
    began and the newest checkpoint uploaded (no trainer is left to upload another)."""
    from tests.cluster.controlplane import down

    capture = faults.LogCapture(c.a, ns)
    capture()
    trained = max((s for _, s in t.RunLogs.collect(c.a, ns, JOB, capture.texts).steps()), default=0)
    lost = time.time()
    op_a.stop()
    down(c.dirs["a"], quiet=True)
    uploaded = max(_uploaded_steps(c, store, ns))
    t.log(f"multikueue: worker A stopped {time.time() - lost:.1f}s after the loss began; checkpoint step-{uploaded} "
          f"uploaded before, A trained to step {trained}")
    _free(c.dirs["a"])
    return lost, uploaded


def _nodes_for_b(c: Clusters) -> float:
    """B's two real nodes with the images (the copy's pods, already waiting, kept off them until the images are
    in: they are shared among the nodes only while nothing runs); returns when they are ready."""
    from tests.cluster.controlplane import ClusterState
    from tests.cluster.node import join

    state = ClusterState.load(c.dirs["b"])
    assert state is not None
    join(state, 2, taint=f"{IMPORTING}=true:NoSchedule")
    t.import_images(c.dirs["b"], IMAGES)
    c.b.kubectl("taint", "nodes", "-l", f"{REAL_NODE_LABEL}=true", f"{IMPORTING}:NoSchedule-")
    return time.time()


def _free(directory: Path) -> None:
    """A's node directory (containerd's unpacked images, ~7 GB): B's nodes need the disk."""
    import shutil

    shutil.rmtree(directory / "node", ignore_errors=True)


def _same_as_uninterrupted(c: Clusters, ns: str, digest: str | None) -> None:
    """The same job run straight in B (no queue, no store): its final parameters are the resumed run's."""
    assert digest, "rank 0 logged no final parameter digest"
    ref = t.ddpjob_manifest("ref", ns, node_selector={REAL_NODE_LABEL: "true"}, claim=False)
    c.b.kubectl("apply", "-f", "-", stdin=json.dumps(ref))
    t.wait_job_state(c.b, ns, "ref", "Succeeded", timeout=600)
    expected = t.RunLogs.collect(c.b, ns, "ref").final_digest()
    assert digest == expected, f"final parameters {digest[:16]} differ from the uninterrupted run's {expected}"

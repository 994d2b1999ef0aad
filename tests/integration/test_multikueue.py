"""Issue 45 on three real control planes: a manager whose real Kueue runs MultiKueue, and two worker clusters, each
with its own Kueue, kwok nodes and `ddpjob operator`. A DDPJob submitted to the manager (spec.managedBy
kueue.x-k8s.io/multikueue) runs in the worker with quota, its state and progress show on the manager (MultiKueue
copies the worker copy's status back), and deleting it on the manager removes the copy and its pods.

The clusters are tests/cluster/controlplane.py's, started once for this module; MultiKueue reaches each worker with a
kubeconfig in a Secret, as a platform team sets it up (docs/scheduling.md, "More than one cluster"): the token of a
ServiceAccount whose only DDPJob rights are the chart's `multiKueue.worker` grant."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import Cluster, wait_for
from tests.integration.helm import CHART, RELEASE, Helm
from tests.integration.kueue_support import Kueue, V, job, pods_of
from tests.integration.operator_support import CRD_PATH, EXAMPLES, Jobs, OperatorProcess, Pool

MULTIKUEUE = "kueue.x-k8s.io/multikueue"
KUEUE_NAMESPACE = "kueue-system"


@pytest.fixture(scope="module")
def worker_clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Cluster]]:
    """Two more control planes with Kueue (kwok nodes, no real node), torn down after the module."""
    from tests.cluster.controlplane import down, up

    dirs: list[Path] = []
    try:
        for i in range(2):
            dirs.append(tmp_path_factory.mktemp(f"worker{i}"))
            state = up(dirs[-1])
            Cluster(state.kubeconfig).kubectl("apply", "--server-side", "-f", str(CRD_PATH))
        yield [Cluster(d / "kubeconfig") for d in dirs]
    finally:
        for d in dirs:
            down(d, quiet=True)


@dataclasses.dataclass
class Worker:
    name: str
    cluster: Cluster
    jobs: Jobs
    kq: Kueue
    pool: Pool
    operator: OperatorProcess


@pytest.fixture
def workers(worker_clusters: list[Cluster], namespace: str, tmp_path: Path) -> Iterator[list[Worker]]:
    """This test's namespace in each worker, its queues (worker 0 with quota for a 2-worker job, worker 1 without),
    kwok nodes and an operator watching it."""
    out: list[Worker] = []
    try:
        for i, c in enumerate(worker_clusters):
            c.kubectl("create", "namespace", namespace)
            wait_for(lambda c=c: c.kubectl("get", "sa", "default", "-n", namespace, check=False).returncode == 0,  # type: ignore[misc]
                     timeout=30, describe="the default ServiceAccount")
            w = Worker(f"{namespace}-w{i}"[:63], c, Jobs(c, namespace), Kueue(c, namespace), Pool(c, namespace),
                       OperatorProcess(c, namespace, tmp_path, name=f"w{i}"))
            out.append(w)
            w.pool.add(8)
            w.kq.apply(w.kq.flavor("a", namespace))
            w.kq.queues([("a", "6" if i == 0 else "1")])
            w.operator.start()
        yield out
    finally:
        for w in out:
            w.operator.stop()
            w.kq.delete()
            w.pool.delete()
            w.cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _chart_roles(cluster: Cluster, role: str) -> None:
    """The chart's RBAC for Kueue's MultiKueue in ``role`` (manager or worker), as `helm install --set
    multiKueue.<role>.enabled=true` would create it."""
    out = Helm(cluster)("template", RELEASE, str(CHART), "--kube-version=1.30.0", "--show-only",
                        "templates/multikueue.yaml", "--set", f"multiKueue.{role}.enabled=true").stdout
    cluster.kubectl("apply", "-f", "-", stdin=out)


def _worker_kubeconfig(w: Worker) -> str:
    """The kubeconfig MultiKueue reaches worker ``w`` with: its server and CA, and the token of manifests/examples/
    multikueue/worker-access.yaml's ServiceAccount, whose DDPJob rights are the chart's (not the cluster admin's)."""
    w.cluster.kubectl("apply", "-n", KUEUE_NAMESPACE, "-f", str(EXAMPLES / "multikueue" / "worker-access.yaml"))
    _chart_roles(w.cluster, "worker")
    token = w.cluster.kubectl("create", "token", "multikueue-sa", "-n", KUEUE_NAMESPACE, "--duration=1h").stdout
    flat = yaml.safe_load(w.cluster.kubectl("config", "view", "--raw", "--flatten", "--minify").stdout)
    flat["users"] = [{"name": "multikueue-sa", "user": {"token": token.strip()}}]
    flat["contexts"][0]["context"]["user"] = "multikueue-sa"
    return yaml.safe_dump(flat)


def _multikueue(cluster: Cluster, kq: Kueue, namespace: str, workers: list[Worker]) -> None:
    """The manager's side: a Secret with each worker's kubeconfig, MultiKueueClusters, a MultiKueueConfig, the
    AdmissionCheck, and a ClusterQueue that asks for it."""
    _chart_roles(cluster, "manager")
    for w in workers:
        flat = _worker_kubeconfig(w)
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
             kq.flavor("a", namespace))
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


def _copies(workers: list[Worker], name: str) -> dict[str, dict[str, Any]]:
    return {w.name: w.jobs.get(name) for w in workers if w.jobs.exists(name)}


def test_a_job_submitted_to_the_manager_runs_in_the_worker_with_quota_and_shows_at_home(
    cluster: Cluster, namespace: str, operator: OperatorProcess, jobs: Jobs, kq: Kueue, workers: list[Worker]
) -> None:
    _multikueue(cluster, kq, namespace, workers)
    jobs.apply(job("mk", 2, managedBy=MULTIKUEUE))
    w0 = workers[0]
    w0.jobs.running("mk", 2, timeout=120)
    copy = w0.jobs.get("mk")
    labels = copy["metadata"]["labels"]
    assert "managedBy" not in copy["spec"] and labels.get("kueue.x-k8s.io/prebuilt-workload-name"), labels
    assert list(_copies(workers, "mk")) == [w0.name], "the copy runs in the worker with quota only"
    assert pods_of(jobs, "mk") == [], "no pod on the manager"

    # The copy's status is the manager's: state, ready workers, and progress as rank 0 would report it.
    w0.cluster.kubectl("patch", "ddpjob", "mk", "-n", namespace, "--subresource=status", "--type=merge", "-p",
                       json.dumps({"status": {"progress": {"globalStep": 7, "totalSteps": 100}}}))
    home = wait_for(lambda: (s := jobs.get("mk").get("status") or {}).get("state") == "Running"
                    and (s.get("progress") or {}).get("globalStep") == 7 and s, timeout=60,
                    describe="the copy's Running state and step 7 on the manager",
                    state=lambda: json.dumps(jobs.get("mk").get("status")))
    assert home["ready"] == "2/2", home
    described = cluster.ddpjob("describe", "mk", "-n", namespace).stdout
    assert f"MultiKueue runs the job in worker cluster {w0.name};" in described, described
    assert "State:       Running" in described and "step 7/100" in described, described

    # Deleted at home: the copy and its pods go in the worker.
    jobs.cluster.kubectl("delete", "ddpjob", "mk", "-n", namespace)
    wait_for(lambda: not _copies(workers, "mk") and pods_of(w0.jobs, "mk") == [], timeout=90,
             describe="the copy and its pods deleted in the worker", state=lambda: w0.jobs.describe("mk"))
    print(yaml.safe_dump({"manager status": home}))


def test_a_suspend_on_the_manager_stops_the_copy_and_a_resume_dispatches_it_again(
    cluster: Cluster, namespace: str, operator: OperatorProcess, jobs: Jobs, kq: Kueue, workers: list[Worker]
) -> None:
    """spec.runPolicy.suspend on the manager: the operator deactivates the job's Workload there, Kueue evicts it, and
    MultiKueue deletes the copy and its pods in the worker; the manager's status says Suspended. Set back to false,
    the Workload is active again and MultiKueue dispatches a new copy, which runs."""
    _multikueue(cluster, kq, namespace, workers)
    jobs.apply(job("mk", 2, managedBy=MULTIKUEUE))
    w0 = workers[0]
    first = w0.jobs.running("mk", 2, timeout=120)
    jobs.cluster.kubectl("patch", "ddpjob", "mk", "-n", namespace, "--type=merge", "-p",
                         json.dumps({"spec": {"runPolicy": {"suspend": True}}}))
    wait_for(lambda: not _copies(workers, "mk") and pods_of(w0.jobs, "mk") == [], timeout=90,
             describe="the copy and its pods deleted in the worker", state=lambda: w0.jobs.describe("mk"))
    home = kq.workload("mk")
    assert home is not None and home["spec"]["active"] is False, home
    wait_for(lambda: (jobs.get("mk").get("status") or {}).get("state") == "Suspended", timeout=30,
             describe="Suspended on the manager", state=lambda: json.dumps(jobs.get("mk").get("status")))
    assert pods_of(jobs, "mk") == [], "no pod on the manager"

    jobs.cluster.kubectl("patch", "ddpjob", "mk", "-n", namespace, "--type=merge", "-p",
                         json.dumps({"spec": {"runPolicy": {"suspend": False}}}))
    again = w0.jobs.running("mk", 2, timeout=120)
    assert {p["metadata"]["uid"] for p in again}.isdisjoint(p["metadata"]["uid"] for p in first), "a new copy's pods"
    wait_for(lambda: (jobs.get("mk").get("status") or {}).get("state") == "Running", timeout=60,
             describe="the new copy's Running state on the manager",
             state=lambda: json.dumps(jobs.get("mk").get("status")))
    home = kq.workload("mk")
    assert home is not None and home["spec"]["active"] is True, home


def test_a_lost_worker_cluster_s_job_is_dispatched_to_the_other_and_runs_there(
    cluster: Cluster, namespace: str, operator: OperatorProcess, jobs: Jobs, kq: Kueue, workers: list[Worker]
) -> None:
    """The worker cluster running the copy is stopped (its API server, Kueue and operator down): past MultiKueue's
    workerLostTimeout (tests/cluster/kueue.py) the manager's Workload is evicted, the operator gives its quota back,
    and MultiKueue dispatches the job to the other worker, where a new copy runs and shows at home. Last in the module:
    worker 0 stays down."""
    from tests.cluster.controlplane import down
    from tests.cluster.kueue import WORKER_LOST_TIMEOUT

    _multikueue(cluster, kq, namespace, workers)
    jobs.apply(job("mk", 2, managedBy=MULTIKUEUE))
    w0, w1 = workers
    w0.jobs.running("mk", 2, timeout=120)
    w1.kq.queues([("a", "6")])  # room for it in worker 1 now
    wait_for(lambda: (jobs.get("mk").get("status") or {}).get("state") == "Running", timeout=60,
             describe="Running on the manager", state=lambda: json.dumps(jobs.get("mk").get("status")))
    w0.operator.stop()
    lost = time.monotonic()
    down(w0.cluster.kubeconfig.parent, quiet=True)
    copy = w1.jobs.running("mk", 2, timeout=180)
    dispatched = time.monotonic() - lost
    wait_for(lambda: f"worker cluster {w1.name};" in cluster.ddpjob("describe", "mk", "-n", namespace).stdout,
             timeout=60, describe="the manager names worker 1",
             state=lambda: cluster.ddpjob("describe", "mk", "-n", namespace).stdout)
    home = kq.workload("mk")
    assert home is not None and (home.get("status") or {}).get("clusterName") == w1.name, home
    print(yaml.safe_dump({"workerLostTimeout": WORKER_LOST_TIMEOUT, "seconds from the loss to the copy's pods "
                          "Running in worker 1": round(dispatched, 1), "pods": [p["metadata"]["name"] for p in copy]}))

"""Issue 45 on three real control planes: a manager whose real Kueue runs MultiKueue, and two worker clusters, each
with its own Kueue, kwok nodes and `ddpjob operator`. A DDPJob submitted to the manager (spec.managedBy
kueue.x-k8s.io/multikueue) runs in the worker with quota, its state and progress show on the manager (MultiKueue
copies the worker copy's status back), and deleting it on the manager removes the copy and its pods.

The clusters are tests/cluster/controlplane.py's, started once for this module; MultiKueue is set up as a platform team
does it (tests/integration/multikueue_support.py). The same with real nodes and an object store, where a lost worker
cluster's job resumes in the other: tests/e2e/test_multikueue.py."""

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
from tests.integration.kueue_support import Kueue, job, pods_of
from tests.integration.multikueue_support import MULTIKUEUE, WorkerCluster, connect
from tests.integration.operator_support import CRD_PATH, Jobs, OperatorProcess, Pool


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
class Worker(WorkerCluster):
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


def _copies(workers: list[Worker], name: str) -> dict[str, dict[str, Any]]:
    return {w.name: w.jobs.get(name) for w in workers if w.jobs.exists(name)}


def test_a_job_submitted_to_the_manager_runs_in_the_worker_with_quota_and_shows_at_home(
    cluster: Cluster, namespace: str, operator: OperatorProcess, jobs: Jobs, kq: Kueue, workers: list[Worker]
) -> None:
    connect(cluster, kq, namespace, workers)
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
    connect(cluster, kq, namespace, workers)
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

    connect(cluster, kq, namespace, workers)
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

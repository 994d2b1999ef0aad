"""Faults for the e2e tier, each injected the way it happens in a real cluster: a trainer killed, pods deleted,
force-deleted or evicted (drain), the rendezvous store or the Service deleted, the operator's pod deleted or the
operator down while a worker is lost. Each fault names how many incidents the operator must count for it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from tests.conftest import Cluster, wait_for
from tests.e2e import training as t
from tests.e2e.runs import CAPTURED, JOB


class LogCapture:
    """Worker logs captured during a run: a replaced pod's log is gone from the API once the pod is, so each fault
    is bracketed by captures (right before it, and right after it while a deleted pod is still Terminating)."""

    def __init__(self, cluster: Cluster, ns: str) -> None:
        self.cluster, self.ns = cluster, ns
        self.texts: dict[str, str] = {}

    def __call__(self) -> None:
        self.texts = t.merge_logs(self.texts, t.capture_logs(self.cluster, self.ns, JOB))
        CAPTURED[self.ns] = self.texts  # run_job writes them out if the scenario fails


@dataclass(frozen=True)
class Fault:
    """One fault: what a user reads in the soak's table, its kind, how to inject it, the incidents it costs."""

    name: str
    kind: str
    inject: Callable[[Cluster, str], None]
    incidents: int
    """Incidents the operator must count: 0 when nothing of the job's own was lost (a trainer torchrun restarts
    in place, the operator itself), else 1 whatever the number of pods it takes down."""


def kill9(index: int) -> Callable[[Cluster, str], None]:
    def inject(cluster: Cluster, ns: str) -> None:
        pids = t.kill9_trainer(cluster, ns, f"{JOB}-worker-{index}")
        t.log(f"kill -9 {pids} in {JOB}-worker-{index}")
    return inject


def delete(*pods: str, force: bool = False) -> Callable[[Cluster, str], None]:
    def inject(cluster: Cluster, ns: str) -> None:
        extra = ["--grace-period=0", "--force"] if force else []
        for pod in pods:
            cluster.kubectl("delete", "pod", f"{JOB}-{pod}", "-n", ns, "--wait=false", *extra)
    return inject


def evict(pod: str) -> Callable[[Cluster, str], None]:
    """What `kubectl drain` does to each pod: the Eviction API (the pod gets a DisruptionTarget condition)."""
    def inject(cluster: Cluster, ns: str) -> None:
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": f"{JOB}-{pod}", "namespace": ns}}
        cluster.kubectl("create", "--raw", f"/api/v1/namespaces/{ns}/pods/{JOB}-{pod}/eviction", "-f", "-",
                        stdin=json.dumps(body))
    return inject


def delete_service_then(pod: str) -> Callable[[Cluster, str], None]:
    """The headless Service goes, then a worker: its replacement needs the Service back to resolve the store."""
    def inject(cluster: Cluster, ns: str) -> None:
        cluster.kubectl("delete", "service", JOB, "-n", ns, "--wait=false")
        cluster.kubectl("delete", "pod", f"{JOB}-{pod}", "-n", ns, "--wait=false")
    return inject


def operator_pods(cluster: Cluster) -> list[str]:
    out = cluster.kubectl("get", "pods", "-n", t.OPERATOR_NS, "-l", "app.kubernetes.io/component=operator",
                          "-o", "jsonpath={.items[*].metadata.name}").stdout
    return out.split()


def delete_operator(cluster: Cluster, ns: str) -> None:
    """The operator's pod is deleted; its Deployment starts a new one, which must pick the job up where it was."""
    for pod in operator_pods(cluster):
        cluster.kubectl("delete", "pod", pod, "-n", t.OPERATOR_NS, "--wait=false")


def lose_worker_while_operator_down(pod: str) -> Callable[[Cluster, str], None]:
    """No operator runs while a worker is deleted and gone; the operator that comes back must count and replace
    it although it never saw it go."""
    def inject(cluster: Cluster, ns: str) -> None:
        deploy = f"deployment/{t.RELEASE}"
        cluster.kubectl("scale", deploy, "-n", t.OPERATOR_NS, "--replicas=0")
        wait_for(lambda: not operator_pods(cluster), timeout=90, describe="no operator pod")
        cluster.kubectl("delete", "pod", f"{JOB}-{pod}", "-n", ns, "--wait=true", "--timeout=120s")
        cluster.kubectl("scale", deploy, "-n", t.OPERATOR_NS, "--replicas=1")
        cluster.kubectl("rollout", "status", deploy, "-n", t.OPERATOR_NS, "--timeout=120s")
    return inject


#: The soak (tests/e2e/test_soak.py): 12 faults of 9 kinds after the trainer's own hang (the 13th, a 10th kind).
SOAK = [
    Fault("kill -9 of the trainer in worker-1", "kill -9", kill9(1), 0),
    Fault("delete the rendezvous pod", "rendezvous lost", delete("rdzv"), 1),
    Fault("delete worker-1", "pod deleted", delete("worker-1"), 1),
    Fault("delete the Service, then worker-0 (no operator restart)", "Service + pod deleted",
          delete_service_then("worker-0"), 1),
    Fault("delete the operator's pod", "operator pod deleted", delete_operator, 0),
    Fault("delete the rendezvous pod", "rendezvous lost", delete("rdzv"), 1),
    Fault("evict worker-0 (Eviction API, as kubectl drain)", "pod evicted", evict("worker-0"), 1),
    Fault("kill -9 of the trainer in worker-0", "kill -9", kill9(0), 0),
    Fault("force-delete worker-1 (grace 0)", "pod force-deleted", delete("worker-1", force=True), 1),
    Fault("delete the rendezvous pod", "rendezvous lost", delete("rdzv"), 1),
    Fault("operator down while worker-1 is deleted", "pod lost, operator down",
          lose_worker_while_operator_down("worker-1"), 1),
    Fault("delete worker-0", "pod deleted", delete("worker-0"), 1),
]


def wait_quiet(cluster: Cluster, ns: str, after_checkpoint: int, timeout: float = 300) -> dict[str, object]:
    """Before a fault: the job Running, no incident recovering, and a checkpoint newer than ``after_checkpoint``
    (so the fault tests a resume from a checkpoint written since the last one). Returns the status."""
    def quiet() -> dict[str, object] | None:
        status = t.job_status(cluster, ns, JOB)
        recent = status.get("incidents") or []
        step = int(((status.get("progress") or {}).get("lastCheckpoint") or {}).get("step") or 0)
        if status.get("state") == "Failed":
            raise AssertionError(f"the job failed: {json.dumps(status.get('conditions'))[-1500:]}")
        if status.get("state") != "Running" or (recent and recent[-1].get("outcome") != "Recovered"):
            return None
        return status if step > after_checkpoint else None

    found = wait_for(quiet, timeout=timeout, interval=0.5, describe=f"Running, recovered, checkpoint > "
                     f"{after_checkpoint}", state=lambda: t.describe_job(cluster, ns, JOB))
    assert isinstance(found, dict)
    return found


def wait_incidents(cluster: Cluster, ns: str, count: int, timeout: float = 120) -> None:
    wait_for(lambda: int(t.job_status(cluster, ns, JOB).get("incidentCount") or 0) >= count, timeout=timeout,
             interval=0.5, describe=f"incidentCount >= {count}", state=lambda: t.describe_job(cluster, ns, JOB))


def settle(seconds: float = 3.0) -> None:
    """Give late consequences (an agent that notices a lost store a moment later) time to be counted."""
    time.sleep(seconds)

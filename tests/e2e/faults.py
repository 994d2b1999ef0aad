"""Faults for the e2e tier, each injected the way it happens in a real cluster: a trainer killed, pods deleted,
force-deleted or evicted (drain), the rendezvous store or the Service deleted, the operator's pod deleted or the
operator down while a worker is lost. Each fault names how many incidents the operator must count for it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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

    @contextlib.contextmanager
    def followed(self) -> Iterator[None]:
        """Streams each worker pod's log while the block runs (`kubectl logs -f`, into files: a pipe nobody reads
        would stall it), so a pod deleted in the block keeps every line to its end. Polling alone lost a Kueue-evicted
        worker's last lines, its SIGTERM checkpoint's, when two other runs loaded the machine (CI, 2026-12-06)."""
        with tempfile.TemporaryDirectory(prefix="ddpjob-logs-") as tmp:
            procs: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
            for pod in t.worker_pods(self.cluster, self.ns, JOB):
                name, labels = pod["metadata"]["name"], pod["metadata"]["labels"]
                if labels.get("ddpjob.io/replica-type") != "worker":
                    continue
                path = Path(tmp) / name
                with path.open("wb") as out:
                    procs[f"{name}@{pod['metadata']['uid'][:8]}"] = (subprocess.Popen(
                        ["kubectl", f"--kubeconfig={self.cluster.kubeconfig}", "logs", "-f", "-n", self.ns, name,
                         "-c", "worker", "--timestamps"], stdout=out, stderr=subprocess.DEVNULL), path)
            try:
                yield
            finally:
                for proc, _ in procs.values():  # ended with their containers, or still following a live one
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=10)
                    proc.kill()
                    proc.wait()
                followed = {key: path.read_text(errors="replace") for key, (_, path) in procs.items()}
                self.texts = t.merge_logs(self.texts, followed)
                CAPTURED[self.ns] = self.texts


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


def delete_operator(cluster: Cluster, ns: str) -> None:
    """The operator's pod is deleted; its Deployment starts a new one, which must pick the job up where it was."""
    for pod in t.operator_pods(cluster):
        cluster.kubectl("delete", "pod", pod, "-n", t.OPERATOR_NS, "--wait=false")


def lose_worker_while_operator_down(pod: str) -> Callable[[Cluster, str], None]:
    """No operator runs while a worker is deleted and gone; the operator that comes back must count and replace
    it although it never saw it go."""
    def inject(cluster: Cluster, ns: str) -> None:
        deploy = f"deployment/{t.RELEASE}"
        replicas = cluster.kubectl("get", deploy, "-n", t.OPERATOR_NS, "-o", "jsonpath={.spec.replicas}").stdout
        cluster.kubectl("scale", deploy, "-n", t.OPERATOR_NS, "--replicas=0")
        wait_for(lambda: not t.operator_pods(cluster), timeout=90, describe="no operator pod")
        cluster.kubectl("delete", "pod", f"{JOB}-{pod}", "-n", ns, "--wait=true", "--timeout=120s")
        cluster.kubectl("scale", deploy, "-n", t.OPERATOR_NS, f"--replicas={replicas or 1}")
        cluster.kubectl("rollout", "status", deploy, "-n", t.OPERATOR_NS, "--timeout=120s")
    return inject


#: Seconds from each leader kill to another replica holding the Lease (tests/e2e/test_soak.py prints them).
TAKEOVERS: list[dict[str, Any]] = []


def leader(cluster: Cluster) -> str:
    """The holder identity of the operator's Lease ('' for none): the pod's name, '_', a per-process suffix."""
    return cluster.kubectl("get", "lease", t.RELEASE, "-n", t.OPERATOR_NS, "-o", "jsonpath={.spec.holderIdentity}",
                           check=False).stdout.strip()


def holder_pod(holder: str) -> str:
    """The operator pod of a Lease holder identity ('' for none)."""
    return holder.rpartition("_")[0]


def operator_nodes(cluster: Cluster) -> dict[str, str]:
    """Each operator replica's pod and the node it runs on."""
    return {pod: cluster.kubectl("get", "pod", pod, "-n", t.OPERATOR_NS, "-o", "jsonpath={.spec.nodeName}").stdout
            for pod in t.operator_pods(cluster)}


def kill9_operator(pod: str) -> int:
    """SIGKILL the operator process of ``pod`` from the host (the real nodes' containers are this host's processes;
    inside the container it is PID 1, which ignores a SIGKILL sent from its own PID namespace)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"operator" in argv and any(a.endswith(b"ddpjob") for a in argv[:2]) and f"HOSTNAME={pod}".encode() in env:
            os.kill(int(proc.name), signal.SIGKILL)
            return int(proc.name)
    raise AssertionError(f"no process of operator pod {pod} on this host (kill -9 of the leader needs the real "
                         "nodes of tests/cluster, or a kind cluster on this host)")


def kill9_leader(then: Callable[[Cluster, str], None] | None = None, *, graceful: bool = False
                 ) -> Callable[[Cluster, str], None]:
    """The leading operator replica dies: kill -9 of its process (no Lease release: a standby waits the lease
    duration), or with ``graceful`` its pod deleted (SIGTERM: it releases the Lease). ``then``: a fault injected
    right after, which the replica that takes over must handle."""
    def inject(cluster: Cluster, ns: str) -> None:
        holder = wait_for(lambda: leader(cluster) or None, timeout=60, describe="an operator leader")
        pod = holder_pod(holder)
        at = time.time()
        if graceful:
            cluster.kubectl("delete", "pod", pod, "-n", t.OPERATOR_NS, "--wait=false")
        else:
            t.log(f"kill -9 of the leading operator {pod}: pid {kill9_operator(pod)}")
        if then is not None:
            then(cluster, ns)
        new = wait_for(lambda: (h := leader(cluster)) and h != holder and h, timeout=90, interval=0.2,
                       describe="another operator replica leading")
        took = round(time.time() - at, 1)
        TAKEOVERS.append({"how": "pod deleted" if graceful else "kill -9", "seconds": took, "from": holder,
                          "to": new})
        t.log(f"operator takeover: {holder} -> {new} in {took}s ({'pod deleted' if graceful else 'kill -9'})")
    return inject


#: The soak (tests/e2e/test_soak.py): 12 faults of 10 kinds after the trainer's own hang (the 13th, an 11th kind).
#: The operator runs two replicas (the chart's default); its leader is taken down 5 times, 4 of them together with
#: a fault of the job that the replica taking over must handle.
SOAK = [
    Fault("kill -9 of the trainer in worker-1", "kill -9", kill9(1), 0),
    Fault("delete the rendezvous pod", "rendezvous lost", delete("rdzv"), 1),
    Fault("kill -9 of the leading operator, then delete worker-1", "pod deleted, leader killed",
          kill9_leader(delete("worker-1")), 1),
    Fault("delete the Service, then worker-0 (no operator restart)", "Service + pod deleted",
          delete_service_then("worker-0"), 1),
    Fault("delete the leading operator's pod (Lease released)", "leader pod deleted",
          kill9_leader(graceful=True), 0),
    Fault("delete the rendezvous pod", "rendezvous lost", delete("rdzv"), 1),
    Fault("evict worker-0 (Eviction API, as kubectl drain)", "pod evicted", evict("worker-0"), 1),
    Fault("kill -9 of the leading operator and of the trainer in worker-0", "kill -9, leader killed",
          kill9_leader(kill9(0)), 0),
    Fault("force-delete worker-1 (grace 0)", "pod force-deleted", delete("worker-1", force=True), 1),
    Fault("kill -9 of the leading operator, then delete the rendezvous pod", "rendezvous lost, leader killed",
          kill9_leader(delete("rdzv")), 1),
    Fault("operator down while worker-1 is deleted", "pod lost, operator down",
          lose_worker_while_operator_down("worker-1"), 1),
    Fault("kill -9 of the leading operator, then delete worker-0", "pod deleted, leader killed",
          kill9_leader(delete("worker-0")), 1),
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

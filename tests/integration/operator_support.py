"""Helpers for operator integration tests: the real `ddpjob operator` as a subprocess, and small accessors
for DDPJobs, their pods and kwok failure injection."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.controlplane import free_port
from tests.conftest import Cluster, wait_for

REPO = Path(__file__).resolve().parents[2]
CRD_PATH = REPO / "operator" / "ddpjob_operator" / "crd" / "ddpjob-crd.yaml"
EXAMPLES = REPO / "manifests" / "examples"


class OperatorProcess:
    """`ddpjob operator -n <namespace>` started as a real process, so tests can SIGKILL and restart it."""

    def __init__(self, cluster: Cluster, namespace: str | list[str], log_dir: Path, resync_seconds: float = 60,
                 extra_args: tuple[str, ...] = (), name: str = "", kubeconfig: Path | None = None) -> None:
        self.cluster = cluster
        self.kubeconfig = kubeconfig or cluster.kubeconfig
        self.resync_seconds = resync_seconds
        self.namespaces = [namespace] if isinstance(namespace, str) else list(namespace)
        self.namespace = self.namespaces[0]
        self.extra_args = extra_args
        self.log_path = log_dir / f"operator-{self.namespace}{name and '-' + name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.metrics_port = 0
        self.liveness_port = 0
        self.starts = 0

    def start(self) -> None:
        self.metrics_port, self.liveness_port = free_port(), free_port()
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1"}
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        log.write(f"\n===== operator start #{self.starts + 1} =====\n".encode())
        log.flush()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ddpjob_operator.cli", "operator",
             *[arg for ns in self.namespaces for arg in ("--namespace", ns)],
             "--metrics-port", str(self.metrics_port), "--liveness-port", str(self.liveness_port),
             "--resync-seconds", str(self.resync_seconds), *self.extra_args],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )
        log.close()
        self.starts += 1
        wait_for(self.healthy, timeout=60, describe="the operator's liveness endpoint", state=self.tail)

    def healthy(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"operator exited ({self.proc and self.proc.returncode}):\n{self.tail()}")
        with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=2) as resp:
            return bool(resp.status == 200)

    def leading(self) -> bool:
        """Whether this replica holds the leader Lease (its ddpjob_operator_leader gauge)."""
        return "ddpjob_operator_leader 1.0" in self.metrics()

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
            return str(resp.read().decode())

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    def pause(self) -> None:
        """SIGSTOP: the process keeps its connections but reads nothing (a hung or partitioned operator)."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)  # a paused operator cannot handle SIGTERM
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=15)

    def tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no operator log)"


class Jobs:
    """Accessors for DDPJobs and their children in one namespace."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster = cluster
        self.ns = namespace

    def apply(self, manifest: dict[str, Any] | str) -> None:
        text = manifest if isinstance(manifest, str) else yaml.safe_dump(manifest)
        self.cluster.kubectl("apply", "-n", self.ns, "-f", "-", stdin=text)

    def get(self, name: str) -> dict[str, Any]:
        out = self.cluster.kubectl("get", "ddpjob", name, "-n", self.ns, "-o", "json").stdout
        job: dict[str, Any] = json.loads(out)
        return job

    def exists(self, name: str) -> bool:
        return self.cluster.kubectl("get", "ddpjob", name, "-n", self.ns, check=False).returncode == 0

    def condition(self, name: str, ctype: str) -> dict[str, Any] | None:
        conds = self.get(name).get("status", {}).get("conditions", [])
        return next((c for c in conds if c["type"] == ctype and c["status"] == "True"), None)

    def wait_condition(self, name: str, ctype: str, timeout: float = 60) -> dict[str, Any]:
        return wait_for(lambda: self.condition(name, ctype), timeout=timeout,
                        describe=f"DDPJob {name} condition {ctype}=True", state=lambda: self.describe(name))

    def pods(self, name: str, *, kind: str = "worker") -> list[dict[str, Any]]:
        out = self.cluster.kubectl("get", "pods", "-n", self.ns, "-l",
                                   f"ddpjob.io/job-name={name},ddpjob.io/replica-type={kind}", "-o", "json").stdout
        return sorted(json.loads(out)["items"], key=lambda p: p["metadata"]["name"])

    def live_pods(self, name: str, *, kind: str = "worker") -> list[dict[str, Any]]:
        return [p for p in self.pods(name, kind=kind) if not p["metadata"].get("deletionTimestamp")]

    def running(self, name: str, count: int, *, timeout: float = 60) -> list[dict[str, Any]]:
        def check() -> list[dict[str, Any]] | None:
            pods = self.live_pods(name)
            ok = len(pods) == count and all(p["status"].get("phase") == "Running" for p in pods)
            return pods if ok else None

        return wait_for(check, timeout=timeout, describe=f"{count} Running worker pods of {name}",
                        state=lambda: self.describe(name))

    def annotate(self, pod: str, **annotations: str) -> None:
        self.cluster.kubectl("annotate", "--overwrite", "pod", pod, "-n", self.ns,
                             *(f"{k}={v}" for k, v in annotations.items()))

    def fail(self, pod: str, code: int, message: str = "") -> None:
        """kwok moves the pod to Failed with this exit code (tests/cluster/kwok-stages.yaml)."""
        extra = {"ddpjob.test/termination-message": message} if message else {}
        self.annotate(pod, **{"ddpjob.test/exit-code": str(code)}, **extra)

    def succeed(self, pod: str) -> None:
        self.annotate(pod, **{"ddpjob.test/succeed": "true"})

    def conditions(self, name: str) -> dict[str, dict[str, Any]]:
        """Every condition of the job by type (True or not)."""
        return {c["type"]: c for c in self.get(name).get("status", {}).get("conditions", [])}

    def events(self, name: str) -> list[dict[str, Any]]:
        out = self.cluster.kubectl("get", "events", "-n", self.ns, "-o", "json").stdout
        return [e for e in json.loads(out)["items"]
                if e.get("involvedObject", {}).get("kind") == "DDPJob" and e["involvedObject"].get("name") == name]

    def describe(self, name: str) -> str:
        status = self.cluster.kubectl("get", "ddpjob", name, "-n", self.ns, "-o", "jsonpath={.status}",
                                      check=False).stdout
        pods = self.cluster.kubectl("get", "pods", "-n", self.ns, "-o", "wide", check=False).stdout
        return f"status: {status}\npods:\n{pods}"


def example(name: str, **spec_overrides: Any) -> dict[str, Any]:
    """A manifest from manifests/examples with spec fields overridden (dotted keys not supported: pass dicts)."""
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    doc["spec"].update(spec_overrides)
    return doc


def small_job(name: str, replicas: int = 2, **spec: Any) -> dict[str, Any]:
    """A minimal DDPJob for lifecycle tests (kwok never runs its containers)."""
    body: dict[str, Any] = {
        "replicas": replicas,
        "template": {"spec": {"containers": [{"name": "worker", "image": "ddpjob-worker:dev",
                                              "args": ["python", "-m", "ddpjob_worker.examples.charlm"]}]}},
    }
    body.update(spec)
    return {"apiVersion": "ddpjob.io/v1alpha1", "kind": "DDPJob", "metadata": {"name": name}, "spec": body}


POOL_LABEL = "ddpjob.test/pool"


class Pool:
    """kwok nodes only this test's pods may use."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster, self.ns = cluster, namespace
        self.names: list[str] = []

    def add(self, cpus: int, pool: str | None = None) -> str:
        """A Ready kwok node of ``cpus`` CPUs, labelled and tainted with ``pool`` (default: the namespace)."""
        pool = pool or self.ns
        name = f"{self.ns}-{len(self.names)}"[:63]
        capacity = {"cpu": str(cpus), "memory": "64Gi", "pods": "110"}
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                             "labels": {POOL_LABEL: pool, "kubernetes.io/hostname": name, "type": "kwok"}},
                "spec": {"taints": [{"key": POOL_LABEL, "value": pool, "effect": "NoSchedule"}]},
                "status": {"capacity": capacity, "allocatable": capacity}}
        self.cluster.kubectl("apply", "-f", "-", stdin=json.dumps(node))
        self.names.append(name)
        wait_for(lambda: "True" in self.cluster.kubectl(
            "get", "node", name, "-o", "jsonpath={.status.conditions[?(@.type=='Ready')].status}").stdout,
            timeout=30, describe=f"kwok node {name} Ready")
        return name

    def delete(self) -> None:
        if self.names:
            self.cluster.kubectl("delete", "node", *self.names, "--wait=false", check=False)

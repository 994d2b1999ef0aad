"""Helpers for tests/e2e/test_training.py and hack/demo.py: images onto the real node, the Helm-installed operator,
a small CPU DDPJob running the example trainer, fault injection, and reading logs, progress and the final model."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.conftest import Cluster, wait_for

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "ddpjob-operator"
#: The chart's appVersion: the operator and runtime tags `helm install` with default values deploys, which
#: `make images` (hack/images.sh) tags beside :dev, so the e2e tier installs the operator as docs/packaging.md says.
APP_VERSION = re.search(r'^appVersion: *"?([^"\n]+)"?$', (CHART / "Chart.yaml").read_text(), re.M).group(1)  # type: ignore[union-attr]
OPERATOR_IMAGE = os.environ.get("DDPJOB_E2E_OPERATOR_IMAGE", f"ddpjob-operator:{APP_VERSION}")
WORKER_IMAGE = os.environ.get("DDPJOB_E2E_WORKER_IMAGE", "ddpjob-worker:dev")
#: The runtime the operator injects into every worker pod (init container) and the rendezvous pod's image.
RUNTIME_IMAGE = os.environ.get("DDPJOB_E2E_RUNTIME_IMAGE", f"ddpjob-runtime:{APP_VERSION}")
#: What every DDPJob's pods need on the nodes (hack/demo.py, bench/recovery.py and the e2e session import these).
NODE_IMAGES = [OPERATOR_IMAGE, WORKER_IMAGE, RUNTIME_IMAGE]


def oldest_torch() -> str:
    """The oldest supported torch release: the first of hack/versions.env TORCH_COMPAT_VERSIONS (2.6.0 without it),
    the one `hack/images.sh --e2e` builds the plain image with."""
    for line in (REPO / "hack" / "versions.env").read_text().splitlines():
        if line.startswith("TORCH_COMPAT_VERSIONS="):
            return (line.split("=", 1)[1].strip().strip('"').split() or ["2.6.0"])[0]
    return "2.6.0"


#: A user's own image, nothing of ddpjob in it (tests/e2e/images/plain; built by `hack/images.sh --e2e`).
PLAIN_IMAGE = os.environ.get("DDPJOB_E2E_PLAIN_IMAGE", f"ddpjob-plain:torch-{oldest_torch()}")
#: The same plus transformers, accelerate, lightning and four framework scripts at /app/ (tests/e2e/images/frameworks,
#: tests/e2e/scripts/frameworks; built by `hack/images.sh --e2e` on top of PLAIN_IMAGE).
FRAMEWORKS_IMAGE = os.environ.get("DDPJOB_E2E_FRAMEWORKS_IMAGE", f"ddpjob-frameworks:torch-{oldest_torch()}")
RELEASE, OPERATOR_NS = "ddpjob-operator", "ddpjob-system"

# Every run trains the same model on the same data, so every faulted run must end bitwise equal to the
# uninterrupted one. 180 steps of ~0.6 s (--step-delay stretches them; it changes no number): long enough for the
# soak's dozen faults, each after a checkpoint newer than the last fault's, with steps left to finish on.
EPOCHS, STEPS_PER_EPOCH, CHECKPOINT_EVERY = 3, 60, 5
TRAINER_ARGS = [
    "python", "-m", "ddpjob_worker.examples.charlm", "--epochs", str(EPOCHS),
    "--steps-per-epoch", str(STEPS_PER_EPOCH), "--batch-size", "16", "--d-model", "64",
    "--checkpoint-every", str(CHECKPOINT_EVERY), "--log-every", "1", "--step-delay", "0.5",
    "--seed", "1234", "--save-final", "/checkpoints/final.pt",
]
#: Seconds for one run to reach Succeeded, faults and recovery included. 900 until 2026-11-29, when the run
#: without a claim and the Kueue preemption, correct and still training, reached it at step 145 of 180 in the whole
#: tier on 2 cores (each pod-deletion recovery ~180 s, most of it the replacement's agent importing torch beside the
#: other runs): a hang still ends the run here, a slow machine no longer does.
RUN_TIMEOUT = 1200
TOTAL_STEPS = EPOCHS * STEPS_PER_EPOCH

STEP_RE = re.compile(r"rank=(\d+)/\d+\] ddpjob\.charlm: epoch (\d+) step (\d+)/\d+ loss ([0-9.]+)")
RESUMED_RE = re.compile(r"resumed from checkpoint step-(\d+)")
#: charlm's and the plain tutorial's line, or the framework scripts' (tests/e2e/scripts/frameworks/).
DIGEST_RE = re.compile(r"(?:final parameters sha256 |FINAL_PARAMS_SHA256=)([0-9a-f]{64})")

# Run in a helper pod on the checkpoint volume after the job: which checkpoints exist, and a digest of the
# final parameters over every tensor's exact bytes (names sorted), so "equal" means bitwise equal.


def log(msg: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def helm() -> str:
    from tests.cluster.controlplane import tool

    return str(tool("helm"))


# --- images -------------------------------------------------------------------------------------------------------

def image_id(image: str) -> str:
    return subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", image], capture_output=True, text=True,
                          check=True).stdout.strip()


def stream_import(cluster_dir: Path, image: str) -> int:
    """`docker save IMAGE | ctr images import -` into the node's containerd (k8s.io namespace), with no tarball on
    disk and the layer blobs dropped once unpacked (the worker image is ~6 GB;
    tests.cluster.node_images.import_unpacked). Returns the bytes discarded. Not yet shared with nodes 1..
    (import_images does that once, for every image)."""
    from tests.cluster.node_images import import_unpacked

    save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
    assert save.stdout is not None
    try:
        discarded = import_unpacked(cluster_dir, image, save.stdout, share_now=False)
    finally:  # an import error propagates as it is (docker save then only died of the closed pipe)
        save.stdout.close()
        save.wait()
    if save.returncode != 0:
        raise AssertionError(f"importing {image} failed: docker save exit {save.returncode}")
    return discarded


def import_images(cluster_dir: Path, images: list[str]) -> None:
    """Put the images into the local real node's containerd. A stamp in the cluster directory (whose containerd
    lives and dies with it) skips images already imported with the same ID. A fresh cluster takes every node's
    images from the copy the last import saved outside the repo, when it holds these very images (the 6 GB worker
    image then costs seconds, not two minutes); otherwise it imports them and saves that copy."""
    from tests.cluster import node_images
    from tests.cluster.node import NodeState

    ns = NodeState.load(cluster_dir.resolve())
    assert ns is not None, f"no real node in {cluster_dir}"
    # Keyed by node 0's kubelet PID: a stamp left by an earlier node in the same directory never counts (the
    # containerds restart when images are shared with more nodes, the kubelet does not).
    node = f"kubelet-{ns.pids.get('kubelet')}"
    stamp = cluster_dir / "e2e-images.json"
    done: dict[str, str] = json.loads(stamp.read_text()) if stamp.exists() else {}
    if done.get("node") != node:
        done = {"node": node}
    todo = [image for image in images if done.get(image) != image_id(image)]
    if not todo:
        log(f"{', '.join(images)} already imported into the real node")
        return
    cache = Path(os.environ.get("DDPJOB_CACHE", Path.home() / ".cache" / "ddpjob")) / "node-images"
    saved = cache / node_images.saved_images_key(ns, [image_id(i) for i in images])
    need = node_images.required(ns, images)
    t0 = time.monotonic()
    if todo == images and node_images.restore(ns, saved, need):
        log(f"{', '.join(images)} restored into the real nodes from {saved} ({time.monotonic() - t0:.0f}s)")
    else:
        for image in todo:
            t1 = time.monotonic()
            discarded = stream_import(cluster_dir, image)
            log(f"imported {image} into the real node ({time.monotonic() - t1:.0f}s; "
                f"{discarded / 1e9:.1f} GB of unpacked layer blobs discarded)")
        if todo == images:
            node_images.save(ns, saved, need)
        else:
            node_images.share(ns)
    stamp.write_text(json.dumps({**done, **{image: image_id(image) for image in images}}))


# --- operator -----------------------------------------------------------------------------------------------------

def _image_values() -> list[str]:
    """`--set` flags for images other than the chart's defaults (DDPJOB_E2E_*_IMAGE); none for the defaults, so
    the install is docs/packaging.md's `helm install` as written."""
    out = []
    for key, image, default in (("image", OPERATOR_IMAGE, f"ddpjob-operator:{APP_VERSION}"),
                                ("runtimeImage", RUNTIME_IMAGE, f"ddpjob-runtime:{APP_VERSION}")):
        repo, _, tag = image.rpartition(":")
        if image != default:
            out += ["--set", f"{key}.repository={repo}", "--set", f"{key}.tag={tag}"]
    return out


def helm_install_operator(cluster: Cluster, affinity: dict[str, Any] | None = None) -> None:
    """`helm upgrade --install` the chart (default values: the images `make images` tags with the appVersion) and
    wait for its Deployment; ``affinity`` keeps the operator off nodes that tests take down."""
    t0 = time.monotonic()
    pin = ["--set-json", f"affinity={json.dumps(affinity)}"] if affinity else []
    proc = subprocess.run(
        [helm(), "upgrade", "--install", RELEASE, str(CHART), "--kubeconfig", str(cluster.kubeconfig),
         "-n", OPERATOR_NS, "--create-namespace", *_image_values(), *pin, "--wait", "--timeout", "5m"],
        check=False, capture_output=True, text=True,
    )
    if proc.returncode != 0:
        raise AssertionError(f"helm install failed ({proc.returncode}):\n{proc.stderr}\n"
                             f"{cluster.kubectl('get', 'pods', '-n', OPERATOR_NS, '-o', 'wide', check=False).stdout}")
    cluster.kubectl("-n", OPERATOR_NS, "rollout", "status", f"deployment/{RELEASE}", "--timeout=120s")
    log(f"operator installed with Helm and Ready ({time.monotonic() - t0:.0f}s)")


def helm_uninstall_operator(cluster: Cluster) -> None:
    subprocess.run([helm(), "uninstall", RELEASE, "--kubeconfig", str(cluster.kubeconfig), "-n", OPERATOR_NS,
                    "--wait", "--timeout", "2m"], capture_output=True, text=True, check=False)
    cluster.kubectl("delete", "namespace", OPERATOR_NS, "--wait=false", check=False)


CRD = "ddpjobs.ddpjob.io"


def gone(cluster: Cluster, *what: str, namespace: str | None = None) -> bool:
    scope = ["-n", namespace] if namespace else []
    proc = cluster.kubectl("get", *what, *scope, "--ignore-not-found", "-o", "name", check=False)
    return proc.returncode == 0 and not proc.stdout.strip()


def remove_helm_install(cluster: Cluster) -> None:
    """Back to a cluster that has never seen ddpjob: no release, no operator namespace, no CRD (and so no
    DDPJob of the earlier tests). For the tests that install it another way (marker ``uninstalls``)."""
    helm_uninstall_operator(cluster)
    cluster.kubectl("delete", "crd", CRD, "--ignore-not-found", "--wait=false")
    wait_for(lambda: gone(cluster, "namespace", OPERATOR_NS) and gone(cluster, "crd", CRD), timeout=180,
             describe=f"namespace {OPERATOR_NS} and CRD {CRD} gone after helm uninstall",
             state=lambda: cluster.kubectl("get", "namespace", OPERATOR_NS, "-o", "yaml", check=False).stdout)


# --- the job ------------------------------------------------------------------------------------------------------

def ddpjob_manifest(name: str, ns: str, *, node_selector: dict[str, str], args: list[str] | None = None,
                    claim: bool = True, run_policy: dict[str, Any] | None = None,
                    pod_spec: dict[str, Any] | None = None, access_mode: str = "ReadWriteOnce",
                    spares: int = 0, labels: dict[str, str] | None = None, image: str | None = None,
                    command: list[str] | None = None, elastic: dict[str, int] | None = None,
                    checkpoint: dict[str, Any] | None = None) -> dict[str, Any]:
    """The job as a user writes it: the cluster's default StorageClass and no securityContext, so the operator's
    fsGroup default is what makes the root-owned volume writable for the worker (UID 10001). ``claim=False``: no
    checkpoint section at all, the API default (a per-pod emptyDir). ``pod_spec`` adds fields to the template's pod
    spec (affinity, tolerations); ``labels`` go on the DDPJob (Kueue's queue and priority). ``image`` and
    ``command``: a user's own image and its command (instead of the worker image and the trainer's args);
    ``elastic``: the job's ``spec.elastic`` (minReplicas, maxReplicas); ``checkpoint``: fields added to
    ``spec.checkpoint`` (an objectStore, replication settings)."""
    run: dict[str, Any] = {"command": command} if command else {"args": args or TRAINER_ARGS}
    pod_spec = pod_spec or {}
    spec: dict[str, Any] = {
        "replicas": 2, "spares": spares, "nprocPerNode": "1", "maxRestarts": 3,
        "template": {"spec": {
            "nodeSelector": node_selector,
            "terminationGracePeriodSeconds": 45,
            "containers": [{
                "name": "worker", "image": image or WORKER_IMAGE, "imagePullPolicy": "IfNotPresent",
                # One thread per worker: two workers share two cores.
                "env": [{"name": "OMP_NUM_THREADS", "value": "1"}],
                **run,
                # A small CPU request: several runs share node 0 (tests/e2e/background.py).
                "resources": {"requests": {"cpu": "50m", "memory": "256Mi"}, "limits": {"memory": "2Gi"}},
            }],
            **pod_spec,
        }},
        # The store stays in the test's lane (its placement is its own, never copied from the workers'); not
        # the workers' anti-affinity, which would keep it off every node that has a worker.
        "rendezvous": {"nodeSelector": node_selector,
                       **({"tolerations": pod_spec["tolerations"]} if "tolerations" in pod_spec else {})},
        # Running: the rendezvous pod goes at the end; Completed workers (and their logs) stay.
        "runPolicy": {"backoffLimit": 6, "cleanPodPolicy": "Running", **(run_policy or {})},
        **({"elastic": elastic} if elastic else {}),
    }
    if claim:
        volume_claim: dict[str, Any] = {"size": "1Gi", "accessModes": [access_mode]}
        spec["checkpoint"] = {"mountPath": "/checkpoints", "volumeClaim": volume_claim, "retainOnDelete": False}
    if checkpoint:
        spec["checkpoint"] = {**spec.get("checkpoint", {}), **checkpoint}
    meta: dict[str, Any] = {"name": name, "namespace": ns, **({"labels": labels} if labels else {})}
    return {"apiVersion": "ddpjob.io/v1alpha1", "kind": "DDPJob", "metadata": meta, "spec": spec}


def get_json(cluster: Cluster, *args: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)
    return data


def job_status(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    status: dict[str, Any] = get_json(cluster, "ddpjob", name, "-n", ns).get("status") or {}
    return status


def operator_pods(cluster: Cluster) -> list[str]:
    """The operator replicas' pods."""
    out = cluster.kubectl("get", "pods", "-n", OPERATOR_NS, "-l", "app.kubernetes.io/component=operator",
                          "-o", "jsonpath={.items[*].metadata.name}").stdout
    return out.split()


def describe_job(cluster: Cluster, ns: str, name: str) -> str:
    pods = cluster.kubectl("get", "pods", "-n", ns, "-o", "wide", check=False).stdout
    status = json.dumps(job_status(cluster, ns, name), indent=1)[-2500:]
    events = cluster.kubectl("get", "events", "-n", ns, "--sort-by=.lastTimestamp", check=False).stdout[-2500:]
    return f"{pods}\nstatus: {status}\nevents:\n{events}"


def wait_job_state(cluster: Cluster, ns: str, name: str, state: str, timeout: float) -> dict[str, Any]:
    """Wait for `state`; a job that reaches Failed instead fails the test at once with its conditions."""
    def check() -> dict[str, Any] | str | None:
        status = job_status(cluster, ns, name)
        if status.get("state") == state or (status.get("state") == "Failed" and state != "Failed"):
            return status
        return None

    status = wait_for(check, timeout=timeout, interval=1, describe=f"DDPJob {ns}/{name} {state}",
                      state=lambda: describe_job(cluster, ns, name))
    assert isinstance(status, dict)
    if status.get("state") != state:
        raise AssertionError(f"DDPJob {ns}/{name} is {status.get('state')}, not {state}: "
                             f"incidents {json.dumps(status.get('incidents'))[-1500:]}\n"
                             f"{describe_job(cluster, ns, name)}")
    return status


def worker_pods(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = get_json(cluster, "pods", "-n", ns, "-l",
                                          f"ddpjob.io/job-name={name}")["items"]
    return pods


# --- faults -------------------------------------------------------------------------------------------------------

# Inside the worker container (no ps/pgrep in the image): the training processes are torchrun's workers under PID 1
# (ddp-worker execs the launcher); the image's own rule finds them (not helpers the agent runs, not a pre-started
# trainer still waiting for its rank).
KILL_TRAINER = r"""
import os, signal, sys
from ddpjob_worker.procs import training_processes
killed = []
for pid in training_processes(1):
    os.kill(pid, signal.SIGKILL)
    killed.append(pid)
print(killed)
sys.exit(0 if killed else 3)
"""


def has_trainer(cluster: Cluster, ns: str, pod: str) -> bool:
    """Whether the pod runs a training process (a hot spare's agent waits without one)."""
    probe = KILL_TRAINER.replace("os.kill(pid, signal.SIGKILL)", "pass")
    assert probe != KILL_TRAINER, "the probe would kill the trainer: KILL_TRAINER's kill line changed"
    return cluster.kubectl("exec", "-n", ns, pod, "-c", "worker", "--", "python", "-c", probe,
                           check=False).returncode == 0


def kill9_trainer(cluster: Cluster, ns: str, pod: str) -> list[int]:
    out = cluster.kubectl("exec", "-n", ns, pod, "-c", "worker", "--", "python", "-c", KILL_TRAINER).stdout
    pids: list[int] = json.loads(out.strip().splitlines()[-1])
    return pids


# --- results ------------------------------------------------------------------------------------------------------

def parse_ts(stamp: str) -> float:
    """kubectl --timestamps (RFC3339 with nanoseconds) -> epoch seconds."""
    stamp = stamp.rstrip("Z")
    head, _, frac = stamp.partition(".")
    return datetime.fromisoformat(head + "+00:00").timestamp() + float(f"0.{frac or '0'}")


def capture_logs(cluster: Cluster, ns: str, name: str) -> dict[str, str]:
    """pod@uid -> the worker container's log with the kubelet's timestamps, for every worker pod there now."""
    texts: dict[str, str] = {}
    for pod in worker_pods(cluster, ns, name):
        pname = pod["metadata"]["name"]
        if pod["metadata"]["labels"].get("ddpjob.io/replica-type") != "worker":
            continue
        texts[f"{pname}@{pod['metadata']['uid'][:8]}"] = cluster.kubectl(
            "logs", "-n", ns, pname, "-c", "worker", "--timestamps", check=False).stdout
    return texts


def merge_logs(*captures: dict[str, str]) -> dict[str, str]:
    """One text per pod: the longest capture (a log only grows while its pod lives)."""
    out: dict[str, str] = {}
    for capture in captures:
        for key, text in capture.items():
            if len(text) > len(out.get(key, "")):
                out[key] = text
    return out


@dataclass
class RunLogs:
    """Every worker pod's log, with the kubelet's timestamps, as (time, pod, line)."""
    lines: list[tuple[float, str, str]] = field(default_factory=list)

    @classmethod
    def collect(cls, cluster: Cluster, ns: str, name: str, previous: dict[str, str] | None = None) -> RunLogs:
        """Every worker pod's log now, merged with ``previous`` captures (pods replaced since are gone from the
        API, so a run with faults captures logs before and after each one: LogCapture)."""
        texts = merge_logs(previous or {}, capture_logs(cluster, ns, name))
        out = cls()
        for key, text in texts.items():
            for raw in text.splitlines():
                stamp, _, line = raw.partition(" ")
                try:
                    out.lines.append((parse_ts(stamp), key, line))
                except ValueError:
                    continue
        out.lines.sort(key=lambda item: item[0])
        return out

    def losses(self) -> dict[tuple[int, int, int], str]:
        """(rank, epoch, step-in-epoch) -> the loss as logged; a step repeated after a resume keeps its last
        value (the one the finished run is built on)."""
        curve: dict[tuple[int, int, int], str] = {}
        for _, _, line in self.lines:
            if m := STEP_RE.search(line):
                curve[(int(m[1]), int(m[2]), int(m[3]))] = m[4]
        return curve

    def resumes(self, after: float = 0.0) -> list[tuple[float, str, int]]:
        return [(t, pod, int(m[1])) for t, pod, line in self.lines if t >= after and (m := RESUMED_RE.search(line))]

    def first_step_after(self, after: float, before: float = float("inf")) -> float | None:
        """Time of the first training step logged after a resume that came after `after` (and before `before`,
        the next fault): the moment training was making progress again (every rank steps together: a DDP step is
        a collective). None when nothing resumed in that span (the fault cost no restart)."""
        resumed = [t for t, _, _ in self.resumes(after) if t < before]
        if not resumed:
            return None
        start = min(resumed)
        steps = [t for t, _, line in self.lines if t > start and STEP_RE.search(line)]
        return min(steps) if steps else None

    def final_digest(self) -> str | None:
        """The final parameters' digest rank 0 logged (the last one, if the run logged it more than once)."""
        found = [m[1] for _, _, line in self.lines if (m := DIGEST_RE.search(line))]
        return found[-1] if found else None

    def steps(self, rank: int = 0) -> list[tuple[float, int]]:
        """(time, global step) of every step ``rank`` logged, in time order."""
        out = []
        for when, _, line in self.lines:
            if (m := STEP_RE.search(line)) and int(m[1]) == rank:
                out.append((when, int(m[2]) * STEPS_PER_EPOCH + int(m[3])))
        return out

    def back_at(self, fault_at: float, before: float = float("inf")) -> tuple[float, int] | None:
        """When training was back where it stood (the first step after the resume that followed ``fault_at``,
        numbered past every step logged before that resume), and that step: the time the fault cost, replayed
        steps included. None when nothing resumed before ``before`` (the next fault)."""
        resumed = [w for w, _, _ in self.resumes(fault_at) if w < before]
        if not resumed:
            return None
        steps = self.steps()
        stood = max((s for when, s in steps if when < min(resumed)), default=0)
        return next(((when, s) for when, s in steps if when > min(resumed) and s > stood), None)

    def text(self, tail: int = 60) -> str:
        return "\n".join(f"{pod}: {line}" for _, pod, line in self.lines[-tail:])

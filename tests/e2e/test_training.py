"""Real DDP training on a real cluster while processes and pods are killed (issue 6).

The Helm-installed operator runs a 2-worker CPU DDPJob of the example trainer (tests/e2e/training.py has the
settings). One uninterrupted run is the reference; every faulted run must end with the same parameters, bit for
bit (sha256 over every tensor's bytes of `--save-final`), and with the same loss, step for step, for every step
it logged (`--log-every 1`, rank-tagged). Each faulted run also reports the seconds from the fault to the first
training step after the resume (kubelet log timestamps); all numbers land in $TMPDIR/ddpjob-e2e-results.json and
in the summary at the end of the session.

Runs on any KUBECONFIG whose cluster has ddpjob-worker:dev and ddpjob-operator:dev (kind: `kind load
docker-image`); without one, on the local real node (the session fixture), into which the images are imported.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cluster, wait_for
from tests.e2e import training as t
from tests.e2e.conftest import real_node_selector

JOB = "charlm"
pytestmark = pytest.mark.timeout(1500)  # the whole module: ~5 runs of 1-2 min each, image import included
RUN_TIMEOUT = 420  # seconds for one run to reach Succeeded, faults and recovery included


@dataclass
class Run:
    """What one finished run left behind."""
    name: str
    namespace: str
    params_sha256: str
    entries: list[str]
    losses: dict[tuple[int, int, int], str]
    logs: t.RunLogs
    status: dict[str, Any]
    wall_seconds: float


@dataclass
class Env:
    cluster: Cluster
    node_selector: dict[str, str]


@pytest.fixture(scope="module")
def env(cluster: Cluster) -> Iterator[Env]:
    """Images on the node (local real node only), the operator installed with Helm and Ready."""
    given = os.environ.get("KUBECONFIG")
    cluster_dir = Path(cluster.kubeconfig).resolve().parent
    local_node = (cluster_dir / "node" / "state.json").exists()
    images = [t.OPERATOR_IMAGE, t.WORKER_IMAGE]
    if given and Path(given).resolve() == Path(cluster.kubeconfig).resolve() and not os.environ.get(
            "DDPJOB_E2E_IMPORT"):
        t.log(f"KUBECONFIG={given} was given: not importing images; the cluster must already have {images} "
              "(kind: `kind load docker-image ...`; local real node: `make node-import` or DDPJOB_E2E_IMPORT=1)")
    elif local_node:
        t.import_images(cluster_dir, images)
    else:
        pytest.fail(f"no KUBECONFIG given and {cluster_dir} has no real node to import images into")
    t.helm_install_operator(cluster)
    try:
        yield Env(cluster, real_node_selector(cluster))
    finally:
        t.helm_uninstall_operator(cluster)


def _fresh_namespace(cluster: Cluster, prefix: str) -> str:
    ns = f"e2e-{prefix}-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", ns)
    wait_for(lambda: cluster.kubectl("get", "sa", "default", "-n", ns, check=False).returncode == 0,
             timeout=30, describe=f"default ServiceAccount in {ns}")
    return ns


def run_job(env: Env, label: str, fault: Callable[[Env, str], float] | None = None) -> Run:
    """Create the DDPJob in a fresh namespace, optionally inject `fault` (which returns the host time of the
    fault), wait for Succeeded, read the logs and the final model, delete the namespace."""
    cluster = env.cluster
    ns = _fresh_namespace(cluster, label)
    try:
        t0 = time.monotonic()
        manifest = t.ddpjob_manifest(JOB, ns, node_selector=env.node_selector)
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
        t.log(f"{label}: DDPJob {ns}/{JOB} created")
        fault_at = fault(env, ns) if fault else None
        status = t.wait_job_state(cluster, ns, JOB, "Succeeded", timeout=RUN_TIMEOUT)
        wall = time.monotonic() - t0
        logs = t.RunLogs.collect(cluster, ns, JOB)
        volume = t.inspect_volume(cluster, ns, JOB, env.node_selector)
        run = Run(label, ns, volume["sha256"], volume["entries"], logs.losses(), logs, status, wall)
        recovery = None
        resumed = None
        if fault_at is not None:
            first = logs.first_step_after(fault_at)
            assert first is not None, f"{label}: no training step after a resume following the fault\n{logs.text()}"
            recovery = round(first - fault_at, 2)
            resumed = min(step for _, _, step in logs.resumes(fault_at))
            t.log(f"{label}: {recovery:.1f}s from the fault to the first training step after the resume "
                  f"(from checkpoint step-{resumed})")
        t.record(label, wall_seconds=round(wall, 1), recovery_seconds=recovery, resumed_from_step=resumed,
                 restarts=status.get("restarts", 0), params=run.params_sha256[:16],
                 final_loss=status.get("progress", {}).get("loss"))
        t.log(f"{label}: Succeeded in {wall:.0f}s, params sha256 {run.params_sha256[:16]}..., "
              f"restarts {status.get('restarts', 0)}")
        return run
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture(scope="module")
def reference(env: Env) -> Run:
    """The uninterrupted run every faulted run is compared with."""
    return run_job(env, "uninterrupted")


def assert_same_model(run: Run, reference: Run) -> None:
    """Bitwise equal final parameters, and every loss the faulted run logged equals the reference's at the same
    (rank, epoch, step): the resume replayed exactly the training that was lost."""
    assert run.params_sha256 == reference.params_sha256, (
        f"{run.name}: final parameters differ from the uninterrupted run\n{run.logs.text()}")
    differ = {k: (v, reference.losses.get(k)) for k, v in run.losses.items() if reference.losses.get(k) != v}
    assert not differ, f"{run.name}: losses differ from the uninterrupted run (rank, epoch, step): {differ}"
    last = (t.EPOCHS - 1, t.STEPS_PER_EPOCH)
    assert {(r, *last) for r in (0, 1)} <= run.losses.keys(), f"{run.name}: last steps not logged"


def assert_resumed_from_checkpoint(run: Run, fault_at: float | None = None) -> int:
    resumes = run.logs.resumes(fault_at or 0.0)
    assert resumes, f"{run.name}: no 'resumed from checkpoint' after the fault\n{run.logs.text()}"
    step = min(s for _, _, s in resumes)
    assert step >= t.CHECKPOINT_EVERY, f"{run.name}: resumed from step-{step}, not from a checkpoint taken mid-run"
    return step


# --- faults: each waits for a checkpoint, injects, returns the host time of the injection ---------------------------

def _ready_worker(env: Env, ns: str, index: int) -> str:
    pod = f"{JOB}-worker-{index}"
    wait_for(lambda: t.get_json(env.cluster, "pod", pod, "-n", ns)["status"].get("phase") == "Running",
             timeout=240, describe=f"{pod} Running", state=lambda: t.describe_job(env.cluster, ns, JOB))
    return pod


def fault_kill9(env: Env, ns: str) -> float:
    pod = _ready_worker(env, ns, 1)
    step = t.wait_checkpoint(env.cluster, ns, JOB, 2 * t.CHECKPOINT_EVERY)
    at = time.time()
    pids = t.kill9_trainer(env.cluster, ns, pod)
    t.log(f"kill -9 {pids} (the trainer under torchrun) in {pod} after checkpoint step-{step}")
    return at


def _delete(*names: str) -> Callable[[Env, str], float]:
    def fault(env: Env, ns: str) -> float:
        _ready_worker(env, ns, 0)
        _ready_worker(env, ns, 1)
        step = t.wait_checkpoint(env.cluster, ns, JOB, 2 * t.CHECKPOINT_EVERY)
        at = time.time()
        for name in names:
            t.delete_pod(env.cluster, ns, f"{JOB}-{name}")
        t.log(f"deleted pod(s) {', '.join(names)} after checkpoint step-{step}")
        return at
    return fault


# --- the tests ------------------------------------------------------------------------------------------------------

def test_uninterrupted_run_trains_writes_checkpoints_and_succeeds(reference: Run) -> None:
    """Helm-installed operator, 2 real workers, the example trainer: Succeeded, checkpoints and the final model on
    the PV, progress reported to the DDPJob's status."""
    status = reference.status
    assert status["state"] == "Succeeded" and status.get("restarts", 0) == 0
    assert status["progress"]["globalStep"] == t.TOTAL_STEPS
    assert status["progress"]["lastCheckpoint"]["step"] == t.TOTAL_STEPS
    assert f"step-{t.TOTAL_STEPS}" in reference.entries and "final.pt" in reference.entries, reference.entries
    assert not reference.logs.resumes(), "an uninterrupted run must start from scratch and never resume"
    assert len(reference.losses) == 2 * t.TOTAL_STEPS, "both ranks log every step"
    assert any("checkpoint step-" in line for _, _, line in reference.logs.lines)


def test_kill9_trainer_torchrun_restarts_and_resumes(env: Env, reference: Run) -> None:
    """SIGKILL of the python child of torchrun in worker-1: torchrun restarts the worker group in place (same
    pods, no replacement by the operator), training resumes from the checkpoint, same final model."""
    run = run_job(env, "kill9-trainer", fault_kill9)
    assert run.status.get("restarts", 0) == 0, "torchrun, not the operator, must handle a killed trainer"
    pods = {key for _, key, _ in run.logs.lines}
    assert {key.split("@")[0] for key in pods} == {f"{JOB}-worker-0", f"{JOB}-worker-1"} and len(pods) == 2, pods
    assert_resumed_from_checkpoint(run)
    assert_same_model(run, reference)


def test_delete_worker1_pod_replaced_and_resumes(env: Env, reference: Run) -> None:
    """Deleting worker-1's pod: the operator replaces it, both workers re-rendezvous and resume from the latest
    checkpoint, same final model."""
    run = run_job(env, "delete-worker-1", _delete("worker-1"))
    assert_resumed_from_checkpoint(run)
    assert_same_model(run, reference)


def test_delete_worker0_pod_recovers(env: Env, reference: Run) -> None:
    """Deleting worker-0 (the first replica; not special here since the store lives in its own pod)."""
    run = run_job(env, "delete-worker-0", _delete("worker-0"))
    assert_resumed_from_checkpoint(run)
    assert_same_model(run, reference)


def test_delete_rendezvous_pod_recovers(env: Env, reference: Run) -> None:
    """Deleting the rendezvous store pod: the operator recreates it, the workers fail their store calls, are
    replaced and resume from the checkpoint."""
    run = run_job(env, "delete-rdzv", _delete("rdzv"))
    assert_resumed_from_checkpoint(run)
    assert_same_model(run, reference)

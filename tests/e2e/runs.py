"""One training run of the e2e tier: create the DDPJob in a fresh namespace, let a scenario inject faults, wait for
Succeeded, collect logs, the final parameters' digest and the status, check every failure message is readable, and
delete the namespace. Shared by test_training.py and test_soak.py (fixtures in conftest.py)."""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import Cluster, wait_for
from tests.e2e import training as t
from tests.e2e import volumes
from tests.readable import assert_readable

JOB = "charlm"

#: namespace -> the worker logs a scenario captured so far (faults.LogCapture): a failed scenario loses its return
#: value, not these; run_job writes them out with the job's description.
CAPTURED: dict[str, dict[str, str]] = {}
FAILURES_DIR = Path(os.environ.get("DDPJOB_E2E_FAILURES", Path(tempfile.gettempdir()) / "ddpjob-e2e-failures"))


@dataclass
class Env:
    """The cluster with the Helm-installed operator, and where real pods must run."""

    cluster: Cluster
    node_selector: dict[str, str]


@dataclass
class Run:
    """What one finished run left behind."""

    name: str
    namespace: str
    params_sha256: str
    """The digest rank 0 logged of its final parameters (every run has it, with or without a shared volume)."""
    volume_sha256: str | None
    """The digest of final.pt on the checkpoint PVC (runs with a claim)."""
    entries: list[str]
    losses: dict[tuple[int, int, int], str]
    logs: t.RunLogs
    status: dict[str, Any]
    wall_seconds: float
    extra: dict[str, Any] = field(default_factory=dict)


def fresh_namespace(cluster: Cluster, prefix: str) -> str:
    ns = f"e2e-{prefix}-{uuid.uuid4().hex[:5]}"
    create_namespace(cluster, ns)
    return ns


def create_namespace(cluster: Cluster, ns: str) -> None:
    """``ns``, once its default ServiceAccount exists (pods need it)."""
    cluster.kubectl("create", "namespace", ns)
    wait_for(lambda: cluster.kubectl("get", "sa", "default", "-n", ns, check=False).returncode == 0,
             timeout=30, describe=f"default ServiceAccount in {ns}")


Scenario = Callable[[Env, str, float], dict[str, Any]]
"""Injects faults into the running job (namespace, creation time); returns what it measured, with the logs it
captured under "logs" (pod@uid -> text) for pods that faults replaced."""


def run_job(env: Env, label: str, scenario: Scenario | None = None, *, claim: bool = True,
            args: list[str] | None = None, run_policy: dict[str, Any] | None = None,
            timeout: float = t.RUN_TIMEOUT, setup: Callable[[str], None] | None = None, inspect: bool = True,
            after: Callable[[str], dict[str, Any]] | None = None,
            checkpoint_from: Callable[[], dict[str, Any]] | None = None, **manifest: Any) -> Run:
    """Create the DDPJob, run ``scenario`` against it, wait for Succeeded, read everything, delete the namespace.
    ``setup(namespace)`` runs before the job is created (a Kueue LocalQueue, an object store's Secret);
    ``checkpoint_from()``: fields of spec.checkpoint known only after setup; ``inspect=False``: the trainer
    writes no final.pt to inspect on the claim (a user's own script); ``after(namespace)`` runs once the job
    Succeeded, before the namespace goes (reading its volume), and adds to ``extra``."""
    cluster = env.cluster
    ns = fresh_namespace(cluster, label)
    try:
        if setup is not None:
            setup(ns)
        t0 = time.monotonic()
        if checkpoint_from is not None:
            manifest["checkpoint"] = checkpoint_from()
        manifest = t.ddpjob_manifest(JOB, ns, node_selector=env.node_selector, args=args, claim=claim,
                                     run_policy=run_policy, **manifest)
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
        t.log(f"{label}: DDPJob {ns}/{JOB} created")
        extra = scenario(env, ns, t0) if scenario else {}
        status = t.wait_job_state(cluster, ns, JOB, "Succeeded", timeout=max(60.0, timeout - (time.monotonic() - t0)))
        wall = time.monotonic() - t0
        logs = t.RunLogs.collect(cluster, ns, JOB, extra.pop("logs", None))
        digest = logs.final_digest()
        assert digest, f"{label}: rank 0 logged no final parameter digest\n{logs.text()}"
        volume: dict[str, Any] = {}
        if claim and inspect:
            volume = volumes.inspect_volume(cluster, ns, JOB, env.node_selector)
        extra.update(after(ns) if after is not None else {})
        run = Run(label, ns, digest, volume.get("sha256"), volume.get("entries", []), logs.losses(), logs, status,
                  wall, extra)
        checked = assert_readable(cluster.kubectl, ns)
        t.log(f"{label}: Succeeded in {wall:.0f}s, params sha256 {digest[:16]}..., incidents "
              f"{status.get('incidentCount', 0)}, {checked} failure message(s) checked readable")
        return run
    except BaseException:
        _keep_evidence(cluster, label, ns)
        raise
    finally:
        CAPTURED.pop(ns, None)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _keep_evidence(cluster: Cluster, label: str, ns: str) -> None:
    """A failed run's worker logs (those its faults replaced included), the job and its pods, on disk: the CI
    output shows only the assertion, and the namespace is deleted next."""
    out = FAILURES_DIR / ns
    try:
        out.mkdir(parents=True, exist_ok=True)
        for key, text in t.merge_logs(CAPTURED.get(ns, {}), t.capture_logs(cluster, ns, JOB)).items():
            (out / f"{key}.log").write_text(text)
        (out / "job.txt").write_text(t.describe_job(cluster, ns, JOB))
        events = cluster.kubectl("get", "events", "-n", ns, "--sort-by=.lastTimestamp", check=False).stdout
        (out / "events.txt").write_text(events)
        for name, text in _operator_logs(cluster, ns).items():
            (out / name).write_text(text)
        t.log(f"{label}: failed; worker and operator logs, the job and the events kept in {out}")
    except Exception as exc:  # the run's own failure is what matters
        t.log(f"{label}: failed; could not keep its logs: {exc!r}")


def _operator_logs(cluster: Cluster, ns: str) -> dict[str, str]:
    """Each operator replica's log (and its previous container's, after a kill -9), cut to this run's job and the
    lines about no job (leadership, syncs, streams): the other lanes' jobs share the operator."""
    out: dict[str, str] = {}
    for pod in t.operator_pods(cluster):
        for previous in (False, True):
            proc = cluster.kubectl("logs", pod, "-n", t.OPERATOR_NS, "--timestamps",
                                   *(["--previous"] if previous else []), check=False)
            lines = [line for line in proc.stdout.splitlines() if f"job={ns}/" in line or "job=" not in line]
            if proc.returncode == 0 and lines:
                out[f"operator-{pod}{'-previous' if previous else ''}.log"] = "\n".join(lines) + "\n"
    return out


def assert_same_model(run: Run, reference: Run) -> None:
    """Bitwise equal final parameters, and every loss the faulted run logged equals the reference's at the same
    (rank, epoch, step): the resumes replayed exactly the training that was lost."""
    assert run.params_sha256 == reference.params_sha256, (
        f"{run.name}: final parameters differ from the uninterrupted run\n{run.logs.text()}")
    if run.volume_sha256 is not None:
        assert run.volume_sha256 == run.params_sha256, f"{run.name}: final.pt differs from the logged digest"
    differ = {k: (v, reference.losses.get(k)) for k, v in run.losses.items() if reference.losses.get(k) != v}
    assert not differ, f"{run.name}: losses differ from the uninterrupted run (rank, epoch, step): {differ}"
    last = (t.EPOCHS - 1, t.STEPS_PER_EPOCH)
    assert {(r, *last) for r in (0, 1)} <= run.losses.keys(), f"{run.name}: last steps not logged"

"""Kueue preempts a training job on real kubelets, and the job loses no step (issue 29): the session cluster runs
the real Kueue manager (tests/cluster/kueue.py). A ClusterQueue has quota for one job; the low-priority run (the
reference's training, so it must end bitwise equal to it) trains, then a high-priority job arrives. Kueue evicts
the low job: every worker gets SIGTERM and writes its final checkpoint, the pods go, the operator gives the quota
back, the high job runs to Succeeded, Kueue admits the low job again, and it resumes from exactly the SIGTERM
checkpoint. The test prints the steps lost, the seconds from eviction to quota released, and from re-admission to
the first training step."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from tests.conftest import Cluster, wait_for
from tests.e2e import faults, results
from tests.e2e import training as t
from tests.e2e.background import Background, runs_in_background
from tests.e2e.runs import JOB, Env, Run, assert_same_model, run_job

# The first test that needs the session's cluster pays its setup too (the real nodes, importing the images: 6 min
# when the images changed), and its run shares two cores with two others: 900 s was 798 s used on a quiet machine.
pytestmark = pytest.mark.timeout(1500)

V = "kueue.x-k8s.io/v1beta2"
PREEMPTED_RE = re.compile(r"preempted: checkpoint step-(\d+) written")
HIGH = "urgent"
#: WorkloadPriorityClasses (cluster-scoped) of the low and the high job.
PRIORITIES = ("ddpjob-e2e-low", "ddpjob-e2e-high")
#: The high job: the same pods (so it needs the same quota), a short run.
HIGH_ARGS = ["python", "-m", "ddpjob_worker.examples.charlm", "--epochs", "1", "--steps-per-epoch", "10",
             "--batch-size", "16", "--d-model", "64", "--log-every", "1"]


def _queues(cluster: Cluster, ns: str) -> list[str]:
    """Quota for one job (2 workers and the rendezvous pod at 50m CPU and 256Mi each), preemption by priority, in
    ``ns``; returns the cluster-scoped objects to delete afterwards."""
    objs: list[dict[str, Any]] = [
        {"apiVersion": V, "kind": "ResourceFlavor", "metadata": {"name": ns}},
        {"apiVersion": V, "kind": "ClusterQueue", "metadata": {"name": ns}, "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "preemption": {"withinClusterQueue": "LowerPriority"},
            "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{"name": ns, "resources": [
                {"name": "cpu", "nominalQuota": "200m"}, {"name": "memory", "nominalQuota": "1Gi"}]}]}]}},
        {"apiVersion": V, "kind": "LocalQueue", "metadata": {"name": "q", "namespace": ns},
         "spec": {"clusterQueue": ns}},
        *({"apiVersion": V, "kind": "WorkloadPriorityClass", "metadata": {"name": name}, "value": value}
          for name, value in zip(PRIORITIES, (100, 1000), strict=True)),
    ]
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))
    return [*(f"workloadpriorityclass/{p}" for p in PRIORITIES), f"clusterqueue/{ns}", f"resourceflavor/{ns}"]


def _workload(cluster: Cluster, ns: str, job: str) -> dict[str, Any]:
    items = t.get_json(cluster, "workloads.kueue.x-k8s.io", "-n", ns, "-l", f"ddpjob.io/job-name={job}")["items"]
    return items[0] if items else {}


def _admitted(wl: dict[str, Any]) -> bool:
    return any(c["type"] == "Admitted" and c["status"] == "True" for c in wl.get("status", {}).get("conditions", []))


def _preempt(env: Env, ns: str, created: float) -> dict[str, Any]:
    """After a checkpoint, the high-priority job arrives; follow the low job out of its quota and back in."""
    cluster = env.cluster
    capture = faults.LogCapture(cluster, ns)
    faults.wait_quiet(cluster, ns, t.CHECKPOINT_EVERY)
    capture()
    high = t.ddpjob_manifest(HIGH, ns, node_selector=env.node_selector, args=HIGH_ARGS,
                             labels={"kueue.x-k8s.io/queue-name": "q", "kueue.x-k8s.io/priority-class": PRIORITIES[1]})
    evicted = time.time()

    def released() -> bool:  # the evicted workers' logs (their SIGTERM checkpoint) go with them: read them meanwhile
        capture()
        low = _workload(cluster, ns, JOB)
        gone = not [p for p in t.worker_pods(cluster, ns, JOB) if p.get("status", {}).get("phase") == "Running"]
        return gone and not low.get("status", {}).get("admission")

    with capture.followed():
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(high))
        t.log(f"kueue-preempt: high-priority job {ns}/{HIGH} created")
        wait_for(released, timeout=120, interval=0.5, describe="the low job's pods gone and its quota released",
                 state=lambda: t.describe_job(cluster, ns, JOB))
    released_at = time.time()
    queued = t.job_status(cluster, ns, JOB)
    t.wait_job_state(cluster, ns, HIGH, "Succeeded", timeout=600)  # a whole run of its own, on a busy machine
    wait_for(lambda: _admitted(_workload(cluster, ns, JOB)), timeout=120, interval=0.5,
             describe="the low job admitted again")
    readmitted = time.time()
    return {"evicted_at": evicted, "released_s": round(released_at - evicted, 1), "readmitted_at": readmitted,
            "queued": queued, "logs": capture.texts}


@runs_in_background("kueue-preempt")
def kueue_preempt_run(env: Env) -> Run:
    created: list[str] = []

    def setup(ns: str) -> None:
        created.extend(_queues(env.cluster, ns))

    try:
        return run_job(env, "kueue-preempt", _preempt, setup=setup,
                       labels={"kueue.x-k8s.io/queue-name": "q", "kueue.x-k8s.io/priority-class": PRIORITIES[0]})
    finally:
        if created:
            env.cluster.kubectl("delete", *created, "--wait=false", check=False)


@pytest.mark.background("kueue-preempt")
def test_a_preempted_job_resumes_from_its_sigterm_checkpoint_bitwise(background: Background, reference: Run) -> None:
    run = background.result("kueue-preempt")
    extra, evicted = run.extra, run.extra["evicted_at"]
    queued: dict[str, Any] = next((c for c in extra["queued"].get("conditions", []) if c["type"] == "Queued"), {})
    assert extra["queued"].get("state") == "Queued" and queued.get("reason") == "Preempted", extra["queued"]
    saved = [int(m[1]) for when, _, line in run.logs.lines if when >= evicted and (m := PREEMPTED_RE.search(line))]
    assert saved, f"kueue-preempt: no SIGTERM checkpoint logged\n{run.logs.text()}"
    # The last step trained before the re-admission, against the step training went on from.
    trained = [step for when, step in run.logs.steps() if when < extra["readmitted_at"]]
    resumed = run.logs.resumes(extra["readmitted_at"])
    assert resumed, f"kueue-preempt: nothing resumed after the re-admission\n{run.logs.text()}"
    first = run.logs.first_step_after(extra["readmitted_at"])
    lost = max(trained) - min(resumed)[2]
    row = {"params": run.params_sha256[:16], "steps_lost": lost, "checkpoint_step": max(saved),
           "resumed_step": min(resumed)[2],
           "evicted_to_released_s": extra["released_s"],
           "readmitted_to_first_step_s": round(first - extra["readmitted_at"], 1) if first else None,
           "incidents": run.status.get("incidentCount", 0), "wall_seconds": round(run.wall_seconds, 1)}
    results.record("kueue-preempt", **row)
    t.log(f"kueue-preempt: {row}")
    assert min(resumed)[2] == max(saved), (
        f"resumed from step-{min(resumed)[2]}, not from the SIGTERM checkpoint step-{max(saved)}")
    assert lost == 0, f"{lost} step(s) trained after the eviction were lost"
    assert run.status.get("incidentCount", 0) == 0, "a preemption is not an incident"
    assert_same_model(run, reference)

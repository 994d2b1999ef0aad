"""The node-loss kinds of bench/recovery.py (``--kinds node``): a training pod's node powered off or partitioned,
N times each, with ``spares: 0`` and ``spares: 1``, on the local cluster's network-namespace nodes
(tests/cluster/netnodes.py: node 0 runs the operator, nodes 1-4 the job, one worker per node as in
tests/e2e/test_nodes.py, checkpoints on a ReadWriteMany claim).

Each fault takes down the node of a training pod away from the rendezvous pod (the store's own loss is the
``rendezvous deleted`` kind), waits for the first step of the group formed after it, then brings the node back
(power on / heal), waits for it to be Ready and for the old pod's processes to be gone (a partitioned pod runs
on until its kubelet learns it was replaced), and for the job to be quiet again (Running, incident recovered,
spares back, a newer checkpoint). Phases, seconds from the fault: ``detection`` (the survivor's report of the
silent pod, ``status.progress.lostPeers.<pod>.reportTime``), the replacement pod's ``replacementCreated``,
``scheduled`` and ``containerStarted`` (with a spare it becomes the next spare: reported, not on the critical
path), then rank 0's start record: ``rendezvous``, ``checkpointLoaded``, ``firstStep`` (the total).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import Cluster, wait_for
from tests.e2e import faults
from tests.e2e import training as t
from tests.e2e.runs import JOB
from tests.e2e.test_nodes import (
    POLICY,
    SPREAD,
    TOLERATIONS,
    _node_ready,
    _old_pod_processes,
    _pod,
    _training_pod_away_from_the_store,
)

KINDS = ("power off", "partition")
PHASES = ("detection", "replacementCreated", "scheduled", "containerStarted", "rendezvous", "checkpointLoaded",
          "firstStep")
#: The phases on the group's critical path, drawn stacked in the plot.
PLOTTED = ("detection", "rendezvous", "checkpointLoaded", "firstStep")
#: Node 0 (the operator) and four fault nodes: two workers, a spare and a free node for the replacement.
NODES = 5


def ts(value: str | None) -> float | None:
    """An API timestamp (RFC 3339, Z) as epoch seconds; None stays None."""
    return t.parse_ts(value) if value else None


def local_cluster(directory: Path) -> tuple[Cluster, Callable[[], None]]:
    from tests.cluster.controlplane import down, up
    from tests.e2e.conftest import REAL_NODE_LABEL

    state = up(directory, real_node=True, nodes=NODES)
    cluster = Cluster(state.kubeconfig)
    t.import_images(directory, t.NODE_IMAGES)
    node0 = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": f"{REAL_NODE_LABEL}-index", "operator": "In", "values": ["0"]}]}]}}}
    t.helm_install_operator(cluster, node0)  # never on a node the bench takes down
    return cluster, lambda: down(directory, quiet=True)


def _faults_module(how: str) -> tuple[Callable[[Path, str], None], Callable[[Path, str], None]]:
    from tests.cluster import node_faults

    return (node_faults.power_off, node_faults.power_on) if how == "power off" else \
        (node_faults.partition, node_faults.heal)


def _quiet(cluster: Cluster, ns: str, spares: int, after_checkpoint: int) -> int:
    status = faults.wait_quiet(cluster, ns, after_checkpoint, timeout=600)
    if spares:
        wait_for(lambda: t.job_status(cluster, ns, JOB).get("spares") == f"{spares}/{spares}", timeout=300,
                 interval=0.5, describe="the spares ready", state=lambda: t.describe_job(cluster, ns, JOB))
    return int(((status.get("progress") or {}).get("lastCheckpoint") or {}).get("step") or 0)  # type: ignore[union-attr]


def pod_phases_of(pod: dict[str, Any], at: float) -> dict[str, float]:
    """A pod's replacementCreated, scheduled and containerStarted, seconds after ``at`` (1 s timestamps)."""
    conds = {c["type"]: c for c in pod["status"].get("conditions") or []}
    running = next((c["state"]["running"]["startedAt"] for c in pod["status"].get("containerStatuses") or []
                    if "running" in (c.get("state") or {})), None)
    found = {"replacementCreated": ts(pod["metadata"]["creationTimestamp"]),
             "scheduled": ts(conds.get("PodScheduled", {}).get("lastTransitionTime")),
             "containerStarted": ts(running)}
    return {k: max(0.0, v - at) for k, v in found.items() if v is not None}


def _replacement_phases(pod: dict[str, Any], old_uid: str, at: float) -> dict[str, float]:
    return pod_phases_of(pod, at) if pod and pod["metadata"]["uid"] != old_uid else {}


def measure(cluster: Cluster, ns: str, victim: str, old_uid: str, at: float) -> dict[str, Any]:
    """Wait for rank 0's start record of a group formed after the fault and its first step; every phase."""
    def regrouped() -> dict[str, Any] | None:
        start = (t.job_status(cluster, ns, JOB).get("progress") or {}).get("start") or {}
        rdzv, first = ts(start.get("rendezvousTime")), ts(start.get("firstStepTime"))
        # The agent announces the rendezvous alone (the previous group's other times stay until rank 0's
        # first report): a group's record is complete once its first step is not older than it.
        return start if rdzv is not None and first is not None and first >= rdzv > at else None

    start = wait_for(regrouped, timeout=300, interval=0.25, describe=f"first step after the loss of {victim}",
                     state=lambda: t.describe_job(cluster, ns, JOB))
    assert isinstance(start, dict)
    phases = {p: (ts(start.get(f"{p}Time")) or at) - at for p in ("rendezvous", "checkpointLoaded", "firstStep")}
    report = ((t.job_status(cluster, ns, JOB).get("progress") or {}).get("lostPeers") or {}).get(victim) or {}
    reported = ts(report.get("reportTime"))
    if reported is not None and reported > at:
        phases["detection"] = reported - at
    return phases


def one_fault(cluster: Cluster, ns: str, how: str, spares: int) -> dict[str, Any]:
    """One node taken down and brought back; the row of phases."""
    down_fn, up_fn = _faults_module(how)
    directory = Path(cluster.kubeconfig).resolve().parent
    victim = _training_pod_away_from_the_store(cluster, ns)
    pod = _pod(cluster, ns, victim)
    node, uid = pod["spec"]["nodeName"], pod["metadata"]["uid"]
    incidents = int(t.job_status(cluster, ns, JOB).get("incidentCount") or 0)
    at = time.time()
    down_fn(directory, node)
    try:
        row: dict[str, Any] = measure(cluster, ns, victim, uid, at)
        def running() -> dict[str, float] | None:
            phases = _replacement_phases(_pod(cluster, ns, victim), uid, at)
            return phases if "containerStarted" in phases else None

        row.update(wait_for(running, timeout=240, interval=0.5, describe=f"{victim}'s replacement running"))
    finally:
        up_fn(directory, node)
    wait_for(lambda: _node_ready(cluster, node), timeout=180, interval=0.5, describe=f"{node} Ready again")
    wait_for(lambda: not _old_pod_processes(uid), timeout=180, interval=1,
             describe=f"the old {victim}'s processes stopped on {node}")
    status = t.job_status(cluster, ns, JOB)
    last = (status.get("incidents") or [{}])[-1]
    return {"spares": spares, "kind": how, "at": round(at, 3), "node": node, "pod": victim, **row,
            "incidents": int(status.get("incidentCount") or 0) - incidents, "cause": last.get("cause")}


def run_case(cluster: Cluster, spares: int, faults_each: int, spacing: float, trainer: list[str]
             ) -> list[dict[str, Any]]:
    from tests.cluster import netnodes

    ns = f"bench-nodes-{spares}-{os.getpid()}"
    cluster.kubectl("create", "namespace", ns)
    manifest = t.ddpjob_manifest(JOB, ns, node_selector={netnodes.LABEL: "true"}, args=trainer,
                                 access_mode="ReadWriteMany", spares=spares,
                                 run_policy={**POLICY, "backoffLimit": 1000},
                                 pod_spec={"tolerations": TOLERATIONS, "affinity": SPREAD})
    manifest["spec"]["maxRestarts"] = 1000
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
    rows: list[dict[str, Any]] = []
    checkpoint = 0
    try:
        for i in range(faults_each * len(KINDS)):
            checkpoint = _quiet(cluster, ns, spares, checkpoint)
            time.sleep(spacing)
            row = one_fault(cluster, ns, KINDS[i % len(KINDS)], spares)
            rows.append(row)
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    return rows

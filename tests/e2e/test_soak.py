"""The soak (issue 10): ONE 2-worker job of the example trainer on the real node goes through a sequence of faults:
first its own trainer hangs (a test flag) and must be detected as Stalled and restarted; then 12 injected faults
of 10 kinds (tests/e2e/faults.py SOAK: kill -9 twice, three rendezvous losses, deleted, force-deleted and evicted
workers, the Service deleted before a worker, a worker lost while no operator runs), with the operator's leading
replica (of two) taken down 5 times: 4 times by kill -9, each with a fault of the job that the replica taking
over must handle, and once by deleting its pod.
Each fault comes only after a checkpoint newer than the last fault's, so each one tests a resume. The job must
reach Succeeded with every incident counted as the incident rule says and end bitwise equal to the uninterrupted
run. The test prints each fault, the incidents it cost, the seconds from the fault to the first step after the
resume and until training was back where it stood, and the goodput (uninterrupted / faulted wall time)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.conftest import wait_for
from tests.e2e import faults, results
from tests.e2e import training as t
from tests.e2e.background import Background, runs_in_background
from tests.e2e.runs import JOB, Env, Run, assert_same_model, run_job

pytestmark = pytest.mark.timeout(1800)

HANG_AT = 12
DEADLINE = 40
SOAK_ARGS = [*t.TRAINER_ARGS, "--hang-at-step", str(HANG_AT), "--hang-marker", "/checkpoints/.hang-once"]
SOAK_POLICY = {"backoffLimit": 20, "progressDeadlineSeconds": DEADLINE, "onStall": "RestartGroup"}


def _stall_phase(env: Env, ns: str, capture: faults.LogCapture) -> dict[str, Any]:
    """The trainer hangs at HANG_AT: the operator must say Stalled and restart the group as one incident."""
    def stalled() -> dict[str, Any] | None:
        status = t.job_status(env.cluster, ns, JOB)
        cond = next((c for c in status.get("conditions") or [] if c["type"] == "Stalled" and c["status"] == "True"),
                    None)
        if cond:
            capture()  # the hung pods go next: keep their logs (the hang, the last steps)
        return {"condition": cond, "at": time.time()} if cond else None

    seen = wait_for(stalled, timeout=DEADLINE + 240, interval=0.5, describe="condition Stalled",
                    state=lambda: t.describe_job(env.cluster, ns, JOB))
    faults.wait_incidents(env.cluster, ns, 1)
    incident = t.job_status(env.cluster, ns, JOB)["incidents"][0]
    assert incident["cause"] == "Stalled" and sorted(incident["pods"]) == [f"{JOB}-worker-0", f"{JOB}-worker-1"]
    t.log(f"Stalled: {seen['condition']['reason']}: {seen['condition']['message'][:160]}")
    return {"fault": f"the trainer hangs at step {HANG_AT} (--hang-at-step)", "kind": "trainer hang",
            "expected": 1, "incidents": 1, "seen": seen["at"], "stall_reason": seen["condition"]["reason"]}


def soak(env: Env, ns: str, created: float) -> dict[str, Any]:
    """The scenario: the stall, then every fault of faults.SOAK in order."""
    capture = faults.LogCapture(env.cluster, ns)
    rows = [_stall_phase(env, ns, capture)]
    checkpoint = 0
    for n, fault in enumerate(faults.SOAK, start=2):
        status = faults.wait_quiet(env.cluster, ns, checkpoint)
        progress: dict[str, Any] = status.get("progress") or {}  # type: ignore[assignment]
        checkpoint = int(progress["lastCheckpoint"]["step"])
        assert int(progress.get("globalStep", 0)) < t.TOTAL_STEPS - 10, f"no steps left for fault #{n}"
        before = int(status.get("incidentCount") or 0)  # type: ignore[call-overload]
        capture()
        at = time.time()
        t.log(f"fault #{n}: {fault.name} (after checkpoint step-{checkpoint})")
        fault.inject(env.cluster, ns)
        capture()
        if fault.incidents:
            faults.wait_incidents(env.cluster, ns, before + fault.incidents)
        faults.settle()
        rows.append({"fault": fault.name, "kind": fault.kind, "at": at, "expected": fault.incidents,
                     "checkpoint": checkpoint, "before": before})
    # The incident count of each fault, read once the next fault (or the end) is reached: late consequences count.
    return {"rows": rows, "logs": capture.texts}


def _report(run: Run, reference: Run) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = run.extra["rows"]
    logs = run.logs
    hang = next((w for w, _, line in logs.lines if "hanging at step" in line), None)
    rows[0]["at"] = hang
    incidents = run.status.get("incidents") or []
    for row, nxt in zip(rows, [*rows[1:], None], strict=True):
        at = row.get("at")
        first = logs.first_step_after(at, nxt["at"] if nxt else float("inf")) if at else None
        back = logs.back_at(at, nxt["at"] if nxt else float("inf")) if at else None
        row["recovery_s"] = round(first - at, 1) if first and at else None
        row["lost_s"] = round(back[0] - at, 1) if back and at else None
    # Incidents per fault: the incidents whose start falls between this fault and the next.
    starts = [(t.parse_ts(i["startTime"]), i) for i in incidents]
    for row, nxt in zip(rows, [*rows[1:], None], strict=True):
        lo = (row["at"] or 0) - 2
        hi = (nxt["at"] - 2) if nxt and nxt.get("at") else float("inf")
        row["incidents"] = sum(1 for s, _ in starts if lo <= s < hi)
        row["causes"] = sorted({i["cause"] for s, i in starts if lo <= s < hi})
    goodput = reference.wall_seconds / run.wall_seconds
    lines = [f"soak: {len(rows)} faults, {run.status.get('incidentCount')} incidents, wall {run.wall_seconds:.0f}s "
             f"vs uninterrupted {reference.wall_seconds:.0f}s: goodput {goodput:.2f}",
             f"  {'#':>2} {'fault':<58} {'incidents':>9} {'recovery s':>10} {'lost s':>7}  causes"]
    for n, row in enumerate(rows, start=1):
        lines.append(f"  {n:>2} {row['fault']:<58} {row['incidents']:>9} {row['recovery_s'] or '-'!s:>10} "
                     f"{row['lost_s'] or '-'!s:>7}  {','.join(row['causes']) or '-'}")
    for line in lines:
        t.log(line)
    faults_seen = [{k: v for k, v in r.items() if k != "seen"} for r in rows]
    results.record("soak", wall_seconds=round(run.wall_seconds, 1), goodput=round(goodput, 3),
                   incidents=run.status.get("incidentCount"), faults=faults_seen, params=run.params_sha256[:16],
                   takeovers=faults.TAKEOVERS)
    return rows


# After the plain-script runs: the soak takes the operator down twice, which would delay the stall detection that
# test_progress.py times.
@runs_in_background("soak", after=("plain-scripts",))
def soak_run(env: Env) -> Run:
    return run_job(env, "soak", soak, args=SOAK_ARGS, run_policy=SOAK_POLICY, timeout=1500)


@pytest.mark.background("soak")
def test_soak_one_job_through_a_sequence_of_faults(background: Background, reference: Run) -> None:
    run = background.result("soak")
    rows = _report(run, reference)
    assert len(rows) >= 13 and len({r["kind"] for r in rows}) >= 6
    assert sum(r["kind"].startswith("rendezvous lost") for r in rows) == 3
    # Two operator replicas: the leader taken down 5 times, a standby leading within the lease (15 s) each time.
    takeovers = faults.TAKEOVERS
    t.log("operator takeovers: " + ", ".join(f"{x['how']} {x['seconds']}s" for x in takeovers))
    assert len(takeovers) == 5 and all(float(x["seconds"]) <= 15 + 2 * 2 + 3 for x in takeovers), takeovers
    wrong = [(n, r["fault"], r["expected"], r["incidents"], r["causes"]) for n, r in enumerate(rows, start=1)
             if r["incidents"] != r["expected"]]
    assert not wrong, f"incidents counted per fault differ from the incident rule: {wrong}"
    assert run.status["incidentCount"] == sum(r["expected"] for r in rows)
    # Stall detection within its deadline: from the last step before the hang to the Stalled condition.
    last_step = max(w for w, s in run.logs.steps() if w <= rows[0]["at"])
    detected = rows[0]["seen"] - last_step
    t.log(f"Stalled {detected:.0f}s after the last step before the hang (progressDeadlineSeconds {DEADLINE}, "
          f"progress reported every <= 10 s)")
    assert detected <= DEADLINE + 15, f"Stalled only {detected:.0f}s after the last step"
    assert_same_model(run, reference)


@pytest.mark.exclusive
def test_a_drain_of_the_leading_operators_node_hands_over_within_the_lease(env: Env, background: Background) -> None:
    """`kubectl drain` of the node the leading operator replica runs on: the replica there is evicted (SIGTERM),
    releases the Lease, and the replica on the other node leads within the lease duration. Alone (exclusive): the
    leader is moved to the operator's second node first, and a drain of node 0 would evict the runs' pods."""
    background.drain()
    cluster = env.cluster
    nodes = faults.operator_nodes(cluster)
    if len(set(nodes.values())) < 2:
        pytest.skip(f"the operator's replicas share one node ({nodes}): a drain needs them on two "
                    "(DDPJOB_E2E_NODES=8 gives the second replica a node of its own)")
    node0 = cluster.kubectl("get", "nodes", "-l", "ddpjob.io/real-node-index=0", "-o", "name").stdout.strip()
    holder = faults.leader(cluster)
    if nodes.get(faults.holder_pod(holder)) == node0.removeprefix("node/"):
        faults.kill9_leader(graceful=True)(cluster, "")  # hand the Lease to the replica on the second node
        holder = faults.leader(cluster)
        # Both replicas up again first: the PodDisruptionBudget (maxUnavailable 1) refuses an eviction until then.
        cluster.kubectl("rollout", "status", f"deployment/{t.RELEASE}", "-n", t.OPERATOR_NS, "--timeout=120s")
        nodes = faults.operator_nodes(cluster)
    node = nodes[faults.holder_pod(holder)]
    at = time.time()
    try:
        drained = cluster.kubectl("drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=120s")
        new = wait_for(lambda: (h := faults.leader(cluster)) and h != holder and h, timeout=60, interval=0.2,
                       describe="the other replica leading")
        took = time.time() - at
    finally:
        cluster.kubectl("uncordon", node, check=False)
    t.log(f"drain of {node}: {drained.stdout.strip().splitlines()[-1]}; {holder} -> {new} in {took:.1f}s")
    assert nodes.get(faults.holder_pod(new)) != node
    assert took <= 15, f"the other replica led only {took:.1f}s after the drain began (lease duration 15 s)"
    results.record("operator-drain", takeover_seconds=round(took, 1), node=node)

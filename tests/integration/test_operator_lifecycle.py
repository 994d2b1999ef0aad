"""DDPJob lifecycle against the real control plane and a real operator process: creation, success,
failures by exit code, backoff, operator restarts (also mid-creation), suspend, scale, deadline, TTL, delete."""

from __future__ import annotations

import json
import signal
import time
from typing import Any

from tests.conftest import Cluster, wait_for
from tests.integration.operator_support import Jobs, OperatorProcess, example, small_job


def _env(pod: dict[str, Any]) -> dict[str, str]:
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "worker")
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def _node_ready(cluster: Cluster, node: str) -> bool:
    conditions = json.loads(cluster.kubectl("get", "node", node, "-o", "json").stdout)["status"]["conditions"]
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


#: The CPU example with a checkpoint claim the operator creates (the example itself keeps checkpoints on emptyDirs).
CLAIM = {"mountPath": "/checkpoints", "volumeClaim": {"size": "1Gi", "accessModes": ["ReadWriteOnce"]},
         "retainOnDelete": True}


def test_cpu_example_creates_children_runs_and_succeeds(
    cluster: Cluster, namespace: str, operator: OperatorProcess, jobs: Jobs
) -> None:
    jobs.apply(example("cpu-charlm.yaml", checkpoint=CLAIM))
    job = jobs.get("charlm")
    uid = job["metadata"]["uid"]
    pods = jobs.running("charlm", 2)
    assert [p["metadata"]["name"] for p in pods] == ["charlm-worker-0", "charlm-worker-1"]
    for i, pod in enumerate(pods):
        env = _env(pod)
        assert env["PET_RDZV_ID"] == uid, "rendezvous id must be the job UID (pytorch#82160)"
        assert env["PET_RDZV_BACKEND"] == "c10d"
        assert env["PET_RDZV_ENDPOINT"] == f"charlm-rdzv.charlm.{namespace}.svc:29400"
        assert env["PET_NNODES"] == "2" and env["DDPJOB_WORKER_INDEX"] == str(i)
        assert env["DDPJOB_CHECKPOINT_DIR"].startswith("/checkpoints")
        assert pod["spec"]["hostname"] == f"charlm-worker-{i}" and pod["spec"]["subdomain"] == "charlm"
        owner = pod["metadata"]["ownerReferences"][0]
        assert owner["uid"] == uid and owner["controller"] is True
        vols = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        assert any(v.get("persistentVolumeClaim", {}).get("claimName") == "charlm-checkpoints" for v in vols.values())
    assert len(jobs.live_pods("charlm", kind="rendezvous")) == 1
    svc = json.loads(cluster.kubectl("get", "svc", "charlm", "-n", namespace, "-o", "json").stdout)
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    cluster.kubectl("get", "pvc", "charlm-checkpoints", "-n", namespace)

    jobs.wait_condition("charlm", "Running")
    table = cluster.kubectl("get", "ddpjobs", "-n", namespace).stdout
    header = table.splitlines()[0].split()
    for column in ("NAME", "STATE", "READY", "INCIDENTS", "AGE"):
        assert column in header, f"missing printer column {column}: {table}"
    assert "Running" in table.splitlines()[1] and "2/2" in table.splitlines()[1], table

    for pod in pods:
        jobs.succeed(pod["metadata"]["name"])
    jobs.wait_condition("charlm", "Succeeded")
    status = jobs.get("charlm")["status"]
    assert status.get("completionTime"), status
    assert status.get("startTime"), status


def test_retryable_exit_code_replaces_the_pod_and_counts_a_restart(
    cluster: Cluster, operator: OperatorProcess, jobs: Jobs
) -> None:
    jobs.apply(small_job("retry", 2))
    pods = jobs.running("retry", 2)
    old_uid = pods[1]["metadata"]["uid"]
    jobs.fail("retry-worker-1", 137)

    def replaced() -> bool:
        live = jobs.live_pods("retry")
        return any(p["metadata"]["name"] == "retry-worker-1" and p["metadata"]["uid"] != old_uid for p in live)

    wait_for(replaced, timeout=60, describe="worker-1 replaced by a new pod", state=lambda: jobs.describe("retry"))
    wait_for(lambda: jobs.get("retry")["status"].get("restarts") == 1, timeout=30, describe="status.restarts == 1",
             state=lambda: jobs.describe("retry"))
    wait_for(lambda: any("137" in e.get("message", "") for e in jobs.events("retry")), timeout=30,
             describe="an Event naming exit code 137", state=lambda: jobs.events("retry"))
    jobs.running("retry", 2)
    assert not jobs.condition("retry", "Failed")


def test_permanent_exit_code_fails_the_job_with_the_termination_message(
    cluster: Cluster, operator: OperatorProcess, jobs: Jobs
) -> None:
    jobs.apply(small_job("perm", 2))
    jobs.running("perm", 2)
    jobs.fail("perm-worker-0", 1, "ValueError: bad learning rate")
    failed = jobs.wait_condition("perm", "Failed")
    assert "1" in failed["message"] and "bad learning rate" in failed["message"], failed
    assert failed["reason"][0].isupper() and " " not in failed["reason"], failed


def test_backoff_limit_exhausted_fails_the_job(cluster: Cluster, operator: OperatorProcess, jobs: Jobs) -> None:
    jobs.apply(small_job("backoff", 1, runPolicy={"backoffLimit": 1}))
    first = jobs.running("backoff", 1)[0]["metadata"]["uid"]
    jobs.fail("backoff-worker-0", 143)
    wait_for(lambda: any(p["metadata"]["uid"] != first for p in jobs.running("backoff", 1, timeout=60)),
             timeout=60, describe="first replacement")
    jobs.fail("backoff-worker-0", 143)
    failed = jobs.wait_condition("backoff", "Failed")
    assert failed["reason"] == "BackoffLimitExceeded", failed


def test_restarts_survive_an_operator_restart(cluster: Cluster, operator: OperatorProcess, jobs: Jobs) -> None:
    jobs.apply(small_job("survive", 1, runPolicy={"backoffLimit": 5}))
    uid0 = jobs.running("survive", 1)[0]["metadata"]["uid"]
    jobs.fail("survive-worker-0", 137)
    wait_for(lambda: jobs.get("survive")["status"].get("restarts") == 1, timeout=60, describe="restarts == 1",
             state=lambda: jobs.describe("survive"))
    uid1 = wait_for(lambda: next((p["metadata"]["uid"] for p in jobs.running("survive", 1)
                                  if p["metadata"]["uid"] != uid0), None), timeout=60, describe="replacement")
    operator.kill(signal.SIGKILL)
    operator.start()
    time.sleep(2)  # a restarted operator must not reset or re-count anything
    assert jobs.get("survive")["status"].get("restarts") == 1
    jobs.fail("survive-worker-0", 137)
    wait_for(lambda: jobs.get("survive")["status"].get("restarts") == 2, timeout=60, describe="restarts == 2",
             state=lambda: jobs.describe("survive"))
    wait_for(lambda: any(p["metadata"]["uid"] not in (uid0, uid1) for p in jobs.running("survive", 1)),
             timeout=60, describe="second replacement")


def test_operator_sigkilled_mid_creation_converges_to_exactly_16_pods(
    cluster: Cluster, namespace: str, operator: OperatorProcess, jobs: Jobs
) -> None:
    # The operator creates 16 pods in ~0.1 s, too fast to interrupt by timing. A pod quota stops creation
    # part-way (the API server refuses pod 8 and later), so the SIGKILL lands mid-creation every time.
    cluster.kubectl("create", "quota", "pods", "--hard=pods=7", "-n", namespace)
    jobs.apply(small_job("big", 16))
    wait_for(lambda: len(jobs.pods("big")) + len(jobs.pods("big", kind="rendezvous")) == 7, timeout=60,
             describe="creation stopped part-way at the quota", state=lambda: jobs.describe("big"))
    operator.kill(signal.SIGKILL)
    seen = len(jobs.pods("big"))
    assert 1 <= seen < 16
    cluster.kubectl("delete", "quota", "pods", "-n", namespace)
    operator.start()
    pods = jobs.running("big", 16, timeout=90)
    assert sorted(p["metadata"]["name"] for p in pods) == sorted(f"big-worker-{i}" for i in range(16))
    assert len(jobs.pods("big")) == 16, "no duplicates, nothing left over"
    assert len(jobs.pods("big", kind="rendezvous")) == 1
    jobs.wait_condition("big", "Running")
    status = jobs.get("big")["status"]
    assert status.get("restarts", 0) == 0, status
    print(f"worker pods present when the operator was killed: {seen}/16")


def test_suspend_deletes_pods_keeps_pvc_and_counts_then_resume(
    cluster: Cluster, namespace: str, operator: OperatorProcess, jobs: Jobs
) -> None:
    jobs.apply(example("cpu-charlm.yaml", checkpoint=CLAIM))
    jobs.running("charlm", 2)
    jobs.fail("charlm-worker-1", 137)
    wait_for(lambda: jobs.get("charlm")["status"].get("restarts") == 1, timeout=60, describe="restarts == 1")
    jobs.running("charlm", 2)
    cluster.kubectl("patch", "ddpjob", "charlm", "-n", namespace, "--type=merge", "-p",
                    '{"spec":{"runPolicy":{"suspend":true}}}')
    jobs.wait_condition("charlm", "Suspended")
    wait_for(lambda: not jobs.pods("charlm") and not jobs.pods("charlm", kind="rendezvous"), timeout=60,
             describe="all pods deleted on suspend", state=lambda: jobs.describe("charlm"))
    cluster.kubectl("get", "pvc", "charlm-checkpoints", "-n", namespace)
    assert jobs.get("charlm")["status"]["restarts"] == 1
    cluster.kubectl("patch", "ddpjob", "charlm", "-n", namespace, "--type=merge", "-p",
                    '{"spec":{"runPolicy":{"suspend":false}}}')
    jobs.running("charlm", 2)
    wait_for(lambda: not jobs.condition("charlm", "Suspended"), timeout=30, describe="Suspended cleared")
    assert jobs.get("charlm")["status"]["restarts"] == 1


def test_scale_within_the_elastic_range(cluster: Cluster, namespace: str, operator: OperatorProcess,
                                        jobs: Jobs) -> None:
    jobs.apply(small_job("elastic", 4, elastic={"minReplicas": 2, "maxReplicas": 4}))
    pods = jobs.running("elastic", 4)
    assert _env(pods[0])["PET_NNODES"] == "2:4"
    cluster.kubectl("scale", "ddpjob/elastic", "-n", namespace, "--replicas=2")
    jobs.running("elastic", 2)
    assert [p["metadata"]["name"] for p in jobs.live_pods("elastic")] == ["elastic-worker-0", "elastic-worker-1"]
    cluster.kubectl("scale", "ddpjob/elastic", "-n", namespace, "--replicas=4")
    jobs.running("elastic", 4)
    out = cluster.kubectl("scale", "ddpjob/elastic", "-n", namespace, "--replicas=5", check=False)
    assert out.returncode != 0 and "maxReplicas" in out.stderr, out.stderr


def test_active_deadline_fails_the_job(cluster: Cluster, operator: OperatorProcess, jobs: Jobs) -> None:
    jobs.apply(small_job("late", 1, runPolicy={"activeDeadlineSeconds": 3}))
    jobs.running("late", 1)
    failed = jobs.wait_condition("late", "Failed", timeout=60)
    assert failed["reason"] == "DeadlineExceeded", failed
    wait_for(lambda: not jobs.live_pods("late"), timeout=60, describe="running pods cleaned up after the deadline")


def test_ttl_deletes_the_finished_job(cluster: Cluster, operator: OperatorProcess, jobs: Jobs) -> None:
    jobs.apply(small_job("ttl", 1, runPolicy={"ttlSecondsAfterFinished": 2}))
    jobs.running("ttl", 1)
    jobs.succeed("ttl-worker-0")
    jobs.wait_condition("ttl", "Succeeded")
    wait_for(lambda: not jobs.exists("ttl"), timeout=60, describe="DDPJob deleted by its TTL")


def test_delete_keeps_or_removes_the_pvc_as_asked(cluster: Cluster, namespace: str, operator: OperatorProcess,
                                                  jobs: Jobs) -> None:
    for name, retain in (("keep", True), ("drop", False)):
        jobs.apply(small_job(name, 1, checkpoint={"volumeClaim": {"size": "1Gi"}, "retainOnDelete": retain}))
        jobs.running(name, 1)
        cluster.kubectl("get", "pvc", f"{name}-checkpoints", "-n", namespace)
    for name in ("keep", "drop"):
        cluster.kubectl("delete", "ddpjob", name, "-n", namespace, "--wait=true", "--timeout=60s")
        wait_for(lambda: not jobs.pods(name), timeout=60, describe=f"{name}'s pods garbage-collected")  # noqa: B023

    def pvc_exists(n: str) -> bool:
        proc = cluster.kubectl("get", "pvc", f"{n}-checkpoints", "-n", namespace, "-o", "json", check=False)
        return proc.returncode == 0 and not json.loads(proc.stdout)["metadata"].get("deletionTimestamp")

    wait_for(lambda: not pvc_exists("drop"), timeout=60, describe="drop's PVC garbage-collected")
    assert pvc_exists("keep"), "retainOnDelete: true must keep the PVC"


def test_metrics_report_the_run(cluster: Cluster, operator: OperatorProcess, jobs: Jobs) -> None:
    jobs.apply(small_job("metered", 2))
    jobs.running("metered", 2)
    jobs.wait_condition("metered", "Running")
    jobs.fail("metered-worker-0", 137)
    wait_for(lambda: jobs.get("metered")["status"].get("restarts") == 1, timeout=60, describe="restarts == 1")
    jobs.running("metered", 2)

    def families() -> dict[str, float]:
        values: dict[str, float] = {}
        for line in operator.metrics().splitlines():
            if line.startswith("ddpjob_") and not line.startswith("#"):
                name = line.split("{")[0].split(" ")[0]
                values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return values

    def nonzero() -> dict[str, float] | None:
        values = families()
        wanted = [k for k in values if k.endswith(("_count", "_total")) or "jobs" in k]
        return values if wanted and all(values.get(k, 0) > 0 for k in (
            "ddpjob_reconcile_total", "ddpjob_reconcile_duration_seconds_count", "ddpjob_pods_created_total",
            "ddpjob_pods_replaced_total", "ddpjob_time_to_all_running_seconds_count",
            "ddpjob_failure_to_replacement_seconds_count")) else None

    values = wait_for(nonzero, timeout=30, describe="non-zero ddpjob_* metric families",
                      state=lambda: "\n".join(f"{k} {v}" for k, v in sorted(families().items())))
    assert any(k.startswith("ddpjob_jobs") for k in values), values
    # A job's name is a label of the per-job series only (ddpjob_job_*{ddpjob_name}: they go with the job, as
    # kube-state-metrics' do); every other family keeps to small fixed label sets.
    leaked = [line for line in operator.metrics().splitlines()
              if "metered" in line and not line.startswith(("ddpjob_job_", "# "))]
    assert not leaked, f"object names in labels of fleet-wide families: {leaked}"


def test_pod_stuck_terminating_on_a_not_ready_node_is_force_deleted_and_replaced(
    cluster: Cluster, namespace: str, operator: OperatorProcess, jobs: Jobs
) -> None:
    jobs.apply(small_job("stuck", 2, runPolicy={"terminatingNodeTimeoutSeconds": 2}))
    pods = jobs.running("stuck", 2)
    victim = pods[1]
    node = victim["spec"]["nodeName"]
    old_uid = victim["metadata"]["uid"]
    # The node dies: its kubelet will never confirm the deletion, so the pod stays Terminating (trainer#2072).
    jobs.annotate("stuck-worker-1", **{"ddpjob.test/stuck-terminating": "true"})
    cluster.kubectl("annotate", "node", node, "ddpjob.test/not-ready=true")
    try:
        wait_for(lambda: not _node_ready(cluster, node), timeout=30, describe=f"node {node} NotReady")
        # The stuck clock starts when the grace period ends (deletionTimestamp); keep it short here.
        cluster.kubectl("delete", "pod", "stuck-worker-1", "-n", namespace, "--wait=false", "--grace-period=1")

        def replaced() -> bool:
            return any(p["metadata"]["name"] == "stuck-worker-1" and p["metadata"]["uid"] != old_uid
                       for p in jobs.pods("stuck"))

        wait_for(replaced, timeout=60, describe="the stuck pod force-deleted and replaced",
                 state=lambda: jobs.describe("stuck"))
        jobs.running("stuck", 2)
    finally:
        cluster.kubectl("annotate", "node", node, "ddpjob.test/not-ready-", check=False)
        wait_for(lambda: _node_ready(cluster, node), timeout=60, describe=f"node {node} Ready again")


def test_a_suspended_jobs_pod_stuck_terminating_on_a_not_ready_node_is_force_deleted(
    cluster: Cluster, namespace: str, operator: OperatorProcess, jobs: Jobs
) -> None:
    """A held job (suspended here; queued or evicted by Kueue the same) must not keep a pod forever: under Kueue an
    evicted job's quota comes back only once none is left (issue 43 #8)."""
    jobs.apply(small_job("held", 1, runPolicy={"terminatingNodeTimeoutSeconds": 2}))
    [pod] = jobs.running("held", 1)
    node, uid = pod["spec"]["nodeName"], pod["metadata"]["uid"]
    jobs.annotate("held-worker-0", **{"ddpjob.test/stuck-terminating": "true"})
    cluster.kubectl("annotate", "node", node, "ddpjob.test/not-ready=true")
    try:
        wait_for(lambda: not _node_ready(cluster, node), timeout=30, describe=f"node {node} NotReady")
        cluster.kubectl("patch", "ddpjob", "held", "-n", namespace, "--type=merge",
                        "-p", json.dumps({"spec": {"runPolicy": {"suspend": True}}}))

        def gone() -> bool:
            return not any(p["metadata"]["uid"] == uid for p in jobs.pods("held"))

        wait_for(gone, timeout=60, describe="the suspended job's stuck pod force-deleted",
                 state=lambda: jobs.describe("held") + operator.tail(30))
        assert jobs.get("held")["status"]["state"] == "Suspended"
    finally:
        cluster.kubectl("annotate", "node", node, "ddpjob.test/not-ready-", check=False)
        wait_for(lambda: _node_ready(cluster, node), timeout=60, describe=f"node {node} Ready again")

"""Gang scheduling on the real control plane: the real coscheduling scheduler (scheduler-plugins, started by
tests/cluster as a second scheduler), kwok nodes of this test's own, and a real operator process.

Each test gets a private pool of kwok nodes (tainted, so no other test's pod lands there; its jobs tolerate the
taint and select the pool, and the rendezvous pod copies both), sized so the scenario's arithmetic holds:
workers request 1 CPU, the rendezvous pod 50m."""

from __future__ import annotations

import json
import time
from typing import Any

from tests.cluster.gang_scheduler import SCHEDULER_NAME
from tests.conftest import Cluster, wait_for
from tests.integration.operator_support import POOL_LABEL, Jobs, OperatorProcess, Pool, small_job


def job(name: str, ns: str, replicas: int, *, gang: bool = True, **spec: Any) -> dict[str, Any]:
    body = small_job(name, replicas, **({"scheduling": {"gang": {"scheduleTimeoutSeconds": 5}}} if gang else {}),
                     **spec)
    pod_spec = body["spec"]["template"]["spec"]
    pod_spec["containers"][0]["resources"] = {"requests": {"cpu": "1", "memory": "1Gi"}}
    pod_spec["nodeSelector"] = {POOL_LABEL: ns}
    pod_spec["tolerations"] = [{"key": POOL_LABEL, "operator": "Equal", "value": ns, "effect": "NoSchedule"}]
    # The gang's room is the pool's, the rendezvous pod's included (its placement is its own: spec.rendezvous).
    body["spec"]["rendezvous"] = {"nodeSelector": pod_spec["nodeSelector"], "tolerations": pod_spec["tolerations"]}
    return body


def bound(jobs: Jobs, name: str) -> list[str]:
    """Pods of the job (workers and rendezvous) that the scheduler has put on a node."""
    pods = jobs.live_pods(name) + jobs.live_pods(name, kind="rendezvous")
    return [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")]


def pod_group(cluster: Cluster, ns: str, name: str) -> dict[str, Any] | None:
    proc = cluster.kubectl("get", "podgroups.scheduling.x-k8s.io", name, "-n", ns, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def test_two_gangs_on_room_for_one_and_a_half_never_deadlock(cluster: Cluster, namespace: str,
                                                              operator: OperatorProcess, jobs: Jobs,
                                                              pool: Pool) -> None:
    pool.add(3)
    pool.add(3)  # 6 CPUs: one 4-worker job (4.05) fits, two (8.1) do not
    t0 = time.monotonic()
    jobs.apply(job("gang-a", namespace, 4))
    jobs.apply(job("gang-b", namespace, 4))
    for name in ("gang-a", "gang-b"):
        group = wait_for(lambda n=name: pod_group(cluster, namespace, n),  # type: ignore[misc]
                         timeout=30, describe=f"PodGroup {name}")
        assert group["spec"]["minMember"] == 5 and group["spec"]["minResources"]["cpu"] == "4050m", group
        owner = group["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("DDPJob", name, True)

    def one_runs_one_queued() -> tuple[str, str] | None:
        for first, second in (("gang-a", "gang-b"), ("gang-b", "gang-a")):
            ok = len(bound(jobs, first)) == 5 and not bound(jobs, second) and jobs.condition(second, "Queued")
            if ok:
                return first, second
        return None

    first, second = wait_for(one_runs_one_queued, timeout=90, describe="one gang placed whole, the other queued",
                             state=lambda: jobs.describe("gang-a") + jobs.describe("gang-b"))
    placed_s = time.monotonic() - t0
    jobs.running(first, 4)
    queued = jobs.condition(second, "Queued")
    assert queued is not None and queued["reason"] == "GangUnschedulable", queued
    print(f"{first} placed whole and {second} Queued after {placed_s:.1f}s: {queued['message']}")
    # Still nothing of the second one bound a while later: it never holds part of the cluster.
    time.sleep(8)
    assert not bound(jobs, second), jobs.describe(second)

    for pod in jobs.live_pods(first):
        jobs.succeed(pod["metadata"]["name"])
    jobs.wait_condition(first, "Succeeded", timeout=60)
    jobs.running(second, 4, timeout=90)
    wait_for(lambda: (c := jobs.get(second)["status"]) and any(
        x["type"] == "Queued" and x["status"] == "False" for x in c.get("conditions", [])),
        timeout=30, describe=f"{second} Queued=False once placed")
    assert len(bound(jobs, second)) == 5


def test_without_gang_the_same_jobs_are_placed_in_part(cluster: Cluster, namespace: str,
                                                       operator: OperatorProcess, jobs: Jobs, pool: Pool) -> None:
    """The control: the default scheduler places pods one by one, so the second job holds part of the cluster
    while it waits for the rest (with real workers: at the rendezvous, for ever)."""
    pool.add(3)
    pool.add(3)
    jobs.apply(job("plain-a", namespace, 4, gang=False))
    jobs.apply(job("plain-b", namespace, 4, gang=False))

    def partial() -> list[tuple[str, int]] | None:
        # The cluster full (6 slots for 2 x 5 pods) with a job in part: one whole and the other in part, or, as
        # the default scheduler interleaves the two jobs' pods, both in part (the deadlock gang scheduling avoids).
        counts = [(n, len(bound(jobs, n))) for n in ("plain-a", "plain-b")]
        parts = [c for _, c in counts if 0 < c < 5]
        return counts if parts and sum(c for _, c in counts) >= 6 else None

    counts = wait_for(partial, timeout=60, describe="the cluster full, a job placed in part",
                      state=lambda: jobs.describe("plain-a") + jobs.describe("plain-b"))
    print(f"without gang scheduling, pods bound per job: {counts}")
    assert pod_group(cluster, namespace, "plain-a") is None
    for name in ("plain-a", "plain-b"):
        for pod in jobs.live_pods(name):
            assert pod["spec"].get("schedulerName") in (None, "default-scheduler")


def test_a_replacement_joins_the_running_gang(cluster: Cluster, namespace: str, operator: OperatorProcess,
                                              jobs: Jobs, pool: Pool) -> None:
    pool.add(2)
    pool.add(2)  # 4 CPUs: exactly one 3-worker gang; nothing spare for a second gang of it
    jobs.apply(job("heal", namespace, 3))
    before = jobs.running("heal", 3, timeout=90)
    group_uid = wait_for(lambda: pod_group(cluster, namespace, "heal"), timeout=10,
                         describe="PodGroup heal")["metadata"]["uid"]
    lost = before[1]["metadata"]
    t0 = time.monotonic()
    jobs.fail(lost["name"], 137)

    def replaced() -> dict[str, Any] | None:
        pods = [p for p in jobs.live_pods("heal") if p["metadata"]["name"] == lost["name"]]
        new = [p for p in pods if p["metadata"]["uid"] != lost["uid"] and p["status"].get("phase") == "Running"]
        return new[0] if new else None

    new = wait_for(replaced, timeout=60, describe="the replacement Running", state=lambda: jobs.describe("heal"))
    took = time.monotonic() - t0
    print(f"replacement of {lost['name']} Running {took:.1f}s after the failure, in the same PodGroup")
    assert new["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "heal"
    assert new["spec"]["schedulerName"] == SCHEDULER_NAME
    # The others kept running: no new gang was formed around the replacement.
    others = {p["metadata"]["uid"] for p in jobs.live_pods("heal") if p["metadata"]["name"] != lost["name"]}
    assert others == {p["metadata"]["uid"] for p in before if p["metadata"]["name"] != lost["name"]}
    assert pod_group(cluster, namespace, "heal")["metadata"]["uid"] == group_uid  # type: ignore[index]


def test_elastic_gang_runs_with_what_fits_and_scales(cluster: Cluster, namespace: str, operator: OperatorProcess,
                                                     jobs: Jobs, pool: Pool) -> None:
    pool.add(3)
    pool.add(1)  # 4 CPUs in two nodes: the rendezvous pod and 3 workers fit however placed, a 4th never
    jobs.apply(job("elastic", namespace, 4, elastic={"minReplicas": 2, "maxReplicas": 4}))
    group = wait_for(lambda: pod_group(cluster, namespace, "elastic"), timeout=30, describe="PodGroup elastic")
    assert group["spec"]["minMember"] == 3, group  # minReplicas + the rendezvous pod

    def three_running() -> bool:
        pods = jobs.live_pods("elastic")
        return sum(bool(p["status"].get("phase") == "Running") for p in pods) == 3

    wait_for(three_running, timeout=90, describe="3 of 4 workers Running", state=lambda: jobs.describe("elastic"))
    pending = [p for p in jobs.live_pods("elastic") if not p["spec"].get("nodeName")]
    assert len(pending) == 1, jobs.describe("elastic")

    # Scale down within the range: the unplaceable worker goes, the job runs whole; the group stays as it is.
    jobs.cluster.kubectl("scale", "ddpjob", "elastic", "-n", namespace, "--replicas=3")
    jobs.running("elastic", 3, timeout=60)
    jobs.wait_condition("elastic", "Running", timeout=60)
    # Scale up with room for it: the new worker joins the running group alone.
    pool.add(1)
    jobs.cluster.kubectl("scale", "ddpjob", "elastic", "-n", namespace, "--replicas=4")
    jobs.running("elastic", 4, timeout=60)
    after = pod_group(cluster, namespace, "elastic")
    assert after is not None and after["metadata"]["uid"] == group["metadata"]["uid"]
    assert after["spec"] == group["spec"]


def test_pod_group_comes_back_and_goes_with_the_job(cluster: Cluster, namespace: str, operator: OperatorProcess,
                                                   jobs: Jobs, pool: Pool) -> None:
    pool.add(4)
    jobs.apply(job("gone", namespace, 2))
    jobs.running("gone", 2, timeout=90)
    old = pod_group(cluster, namespace, "gone")
    assert old is not None
    cluster.kubectl("delete", "podgroups.scheduling.x-k8s.io", "gone", "-n", namespace)
    wait_for(lambda: (g := pod_group(cluster, namespace, "gone")) is not None
             and g["metadata"]["uid"] != old["metadata"]["uid"], timeout=15, describe="PodGroup created again")
    cluster.kubectl("delete", "ddpjob", "gone", "-n", namespace, "--wait=true", "--timeout=60s")
    wait_for(lambda: pod_group(cluster, namespace, "gone") is None, timeout=60,
             describe="PodGroup garbage-collected with its DDPJob")

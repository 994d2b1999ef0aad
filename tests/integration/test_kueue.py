"""Kueue on the real control plane: the real Kueue manager (tests/cluster/kueue.py, DDPJob registered as an
external framework), kwok nodes of this test's own, and a real operator process. Kueue admits, flavors, preempts;
the operator creates Workloads, holds pods until admission, places them, stops them on eviction and gives the
quota back.

Each test gets its own pool of tainted kwok nodes and its own cluster-scoped Kueue objects (named after the test's
namespace). The jobs set no node selector or toleration: what the pods carry comes from the admitted flavor.
Workers request 1 CPU and 1Gi, the rendezvous pod 50m CPU."""

from __future__ import annotations

import time

from tests.conftest import wait_for
from tests.integration.kueue_support import Kueue, job, pods_of
from tests.integration.operator_support import POOL_LABEL, Jobs, OperatorProcess, Pool


def test_three_jobs_on_quota_for_one_are_admitted_one_at_a_time(namespace: str, operator: OperatorProcess,
                                                                 jobs: Jobs, pool: Pool, kq: Kueue) -> None:
    pool.add(8)
    kq.apply(kq.flavor("a", namespace))
    kq.queues([("a", "2.5")], queueingStrategy="StrictFIFO")  # one 2-worker job (2.05 CPU), not two
    names = ["kq-1", "kq-2", "kq-3"]
    for n in names:
        jobs.apply(job(n, 2))
    done: list[str] = []
    for _ in names:
        def one_admitted() -> str | None:
            admitted = [n for n in names if n not in done and kq.admitted(n)]
            with_pods = [n for n in names if n not in done and pods_of(jobs, n)]
            assert len(admitted) <= 1 and set(with_pods) <= set(admitted), (admitted, with_pods)
            return admitted[0] if admitted and len(jobs.live_pods(admitted[0])) == 2 else None

        first = wait_for(one_admitted, timeout=60, describe="exactly one job admitted, only it with pods",
                         state=lambda: "".join(jobs.describe(n) for n in names))
        running = jobs.running(first, 2, timeout=60)
        for n in names:
            if n != first and n not in done:
                queued = jobs.condition(n, "Queued")
                assert queued is not None and jobs.get(n)["status"]["state"] == "Queued", jobs.describe(n)
        for pod in running:
            jobs.succeed(pod["metadata"]["name"])
        jobs.wait_condition(first, "Succeeded", timeout=60)
        wait_for(lambda f=first: any(c["type"] == "Finished" and c["status"] == "True"  # type: ignore[misc]
                                     for c in (kq.workload(f) or {}).get("status", {}).get("conditions", [])),
                 timeout=30, describe=f"{first}'s Workload Finished")
        done.append(first)
    print(f"admitted in order {done}")


def test_pods_carry_the_admitted_flavors_labels_and_tolerations(namespace: str, operator: OperatorProcess,
                                                                 jobs: Jobs, pool: Pool, kq: Kueue) -> None:
    pool.add(4, pool=f"{namespace}-x")
    pool.add(4, pool=f"{namespace}-y")
    kq.apply(kq.flavor("x", f"{namespace}-x"), kq.flavor("y", f"{namespace}-y"))
    # x is too small for the workers (2 CPU) but not for the rendezvous pod (50m): Kueue assigns each pod set its
    # own flavor, and each pod gets its own pod set's node labels and tolerations.
    kq.queues([("x", "1"), ("y", "4")])
    jobs.apply(job("flav", 2))
    workers = jobs.running("flav", 2, timeout=60)
    for pods, where in ((workers, f"{namespace}-y"), (jobs.live_pods("flav", kind="rendezvous"), f"{namespace}-x")):
        assert pods
        for pod in pods:
            assert pod["spec"]["nodeSelector"] == {POOL_LABEL: where}, pod["spec"]
            assert {"key": POOL_LABEL, "operator": "Equal", "value": where,
                    "effect": "NoSchedule"} in pod["spec"]["tolerations"]
    admitted = jobs.condition("flav", "Admitted")
    assert admitted is not None and f"workers: 2 pod(s), cpu={namespace}-y" in admitted["message"], admitted
    assert f"rendezvous: 1 pod(s), cpu={namespace}-x" in admitted["message"], admitted


def test_an_elastic_job_with_quota_for_three_runs_three(namespace: str, operator: OperatorProcess, jobs: Jobs,
                                                         pool: Pool, kq: Kueue) -> None:
    pool.add(8)
    kq.apply(kq.flavor("a", namespace))
    kq.queues([("a", "3.5")])  # the rendezvous pod and 3 workers, not 4
    jobs.apply(job("ela", 4, elastic={"minReplicas": 2, "maxReplicas": 4}))
    jobs.running("ela", 3, timeout=60)
    wl = kq.workload("ela")
    assert wl is not None
    counts = {a["name"]: a["count"] for a in wl["status"]["admission"]["podSetAssignments"]}
    assert counts == {"workers": 3, "rendezvous": 1}, counts
    # Every admitted pod runs: PodsReady=True on the Workload (Kueue's waitForPodsReady reads it).
    wait_for(lambda: any(c["type"] == "PodsReady" and c["status"] == "True" and c["reason"] == "Started"
                         for c in (kq.workload("ela") or {}).get("status", {}).get("conditions", [])),
             timeout=30, describe="the Workload PodsReady=True")
    time.sleep(3)
    assert len(jobs.live_pods("ela")) == 3 and jobs.get("ela")["status"]["ready"].endswith("/3")


def test_a_high_priority_job_preempts_and_the_low_one_comes_back(namespace: str, operator: OperatorProcess,
                                                                 jobs: Jobs, pool: Pool, kq: Kueue) -> None:
    pool.add(8)
    kq.apply(kq.flavor("a", namespace))
    kq.queues([("a", "2.5")], preemption={"withinClusterQueue": "LowerPriority"})
    low, high = kq.priority("low", 100), kq.priority("high", 1000)
    jobs.apply(job("low", 2, priority=low))
    before = {p["metadata"]["uid"] for p in jobs.running("low", 2, timeout=60)}
    t0 = time.monotonic()
    jobs.apply(job("high", 2, priority=high))
    wait_for(lambda: not pods_of(jobs, "low") and not (kq.workload("low") or {}).get("status", {}).get("admission"),
             timeout=60, describe="low's pods gone and its quota released", state=lambda: jobs.describe("low"))
    released = time.monotonic() - t0
    queued = jobs.condition("low", "Queued")
    assert queued is not None and queued["reason"] == "Preempted" and jobs.get("low")["status"]["state"] == "Queued"
    high_pods = jobs.running("high", 2, timeout=60)
    assert jobs.get("low")["status"].get("incidentCount", 0) == 0, "a preemption is not an incident"
    for pod in high_pods:
        jobs.succeed(pod["metadata"]["name"])
    jobs.wait_condition("high", "Succeeded", timeout=60)
    after = jobs.running("low", 2, timeout=60)
    assert not before & {p["metadata"]["uid"] for p in after}
    reasons = [e["reason"] for e in jobs.events("low")]
    assert "Queued" in reasons and reasons.count("Admitted") >= 2, reasons
    print(f"preempted: low's pods gone and quota released {released:.1f}s after high was created")


def test_a_queue_that_does_not_exist_says_so_and_creates_no_pod(namespace: str, operator: OperatorProcess,
                                                                 jobs: Jobs, kq: Kueue) -> None:
    jobs.apply(job("lost", 2, queue="no-such-queue"))
    queued = wait_for(lambda: (c := jobs.condition("lost", "Queued")) and "no-such-queue" in c["message"] and c,
                      timeout=30, describe="Queued naming the missing LocalQueue", state=lambda: jobs.describe("lost"))
    print(f"Queued: {queued['reason']}: {queued['message']}")
    assert not pods_of(jobs, "lost")


def test_a_deleted_workload_stops_the_pods_and_queues_the_job_again(namespace: str, operator: OperatorProcess,
                                                                    jobs: Jobs, pool: Pool, kq: Kueue) -> None:
    pool.add(8)
    kq.apply(kq.flavor("a", namespace))
    kq.queues([("a", "4")])
    jobs.apply(job("again", 2))
    before = {p["metadata"]["uid"] for p in jobs.running("again", 2, timeout=60)}
    first = kq.workload("again")
    assert first is not None
    kq.cluster.kubectl("delete", "workloads.kueue.x-k8s.io", first["metadata"]["name"], "-n", namespace)
    wait_for(lambda: (w := kq.workload("again")) is not None and w["metadata"]["uid"] != first["metadata"]["uid"],
             timeout=30, describe="a new Workload")
    after = {p["metadata"]["uid"] for p in jobs.running("again", 2, timeout=60)}  # admitted again: quota is free
    assert not before & after, "the pods of the deleted Workload's admission were stopped"
    assert jobs.get("again")["status"].get("incidentCount", 0) == 0


def test_a_suspended_job_gives_its_quota_to_another_and_waits_for_it_on_resume(
        namespace: str, operator: OperatorProcess, jobs: Jobs, pool: Pool, kq: Kueue) -> None:
    """spec.runPolicy.suspend of an admitted job deactivates its Workload: Kueue evicts it, the pods go, the quota goes
    back and admits the next job; resumed, its Workload is active again and it waits for that quota like any job."""
    pool.add(8)
    kq.apply(kq.flavor("a", namespace))
    kq.queues([("a", "2.5")], queueingStrategy="StrictFIFO")  # one 2-worker job at a time
    jobs.apply(job("first", 2))
    jobs.running("first", 2, timeout=60)
    jobs.apply(job("second", 2))
    jobs.cluster.kubectl("patch", "ddpjob", "first", "-n", namespace, "--type=merge", "-p",
                         '{"spec":{"runPolicy":{"suspend":true}}}')
    jobs.running("second", 2, timeout=60)  # the quota the suspended job held
    wl = kq.workload("first")
    assert wl is not None and wl["spec"]["active"] is False, wl
    assert wl["metadata"]["annotations"]["ddpjob.io/suspended"] == "true"
    assert pods_of(jobs, "first") == [] and jobs.get("first")["status"]["state"] == "Suspended"
    jobs.cluster.kubectl("patch", "ddpjob", "first", "-n", namespace, "--type=merge", "-p",
                         '{"spec":{"runPolicy":{"suspend":false}}}')
    wait_for(lambda: jobs.get("first")["status"]["state"] == "Queued"
             and (kq.workload("first") or {}).get("spec", {}).get("active") is True, timeout=30,
             describe="active again and Queued behind the running job", state=lambda: jobs.describe("first"))
    assert pods_of(jobs, "first") == []
    for pod in jobs.running("second", 2):
        jobs.succeed(pod["metadata"]["name"])
    jobs.running("first", 2, timeout=60)
    wl = kq.workload("first")
    assert wl is not None and "ddpjob.io/suspended" not in (wl["metadata"].get("annotations") or {}), wl

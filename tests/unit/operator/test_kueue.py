"""Kueue, pure parts: the queueing policy (table), the Workload a queued job gets, and planner scenarios on an
in-memory cluster whose Workload status plays Kueue's part (admission, partial admission, eviction, deletion)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from ddpjob_operator.api.formats import format_time
from ddpjob_operator.api.spec import InvalidSpec, parse_ddpjob
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.kueue import admission, gate
from ddpjob_operator.planner.kueue import workload as kueue
from ddpjob_operator.planner.kueue.admission import KueueInputs
from ddpjob_operator.planner.kueue.workload import Condition, WorkloadView
from ddpjob_operator.planner.plan import Plan, plan

from .factories import FakeCluster, at, make_job

Obj = dict[str, Any]
TOLERATION = {"key": "spot", "operator": "Exists", "effect": "NoSchedule"}
SPOT: Obj = {"nodeLabels": {"pool": "spot"}, "tolerations": [TOLERATION]}


def view(**conds: tuple[bool, str, str]) -> WorkloadView:
    cq = "cq" if conds.get("QuotaReserved", (False,))[0] else None
    return WorkloadView(conditions={k: Condition(*v) for k, v in conds.items()}, cluster_queue=cq,
                        assignments={}, updates={})


@pytest.mark.parametrize(("wl", "active", "run", "reason", "clear"), [
    (None, False, False, "WorkloadCreated", None),
    (view(QuotaReserved=(False, "Pending", "couldn't assign flavors: insufficient quota")), False, False,
     "Pending", None),
    (view(QuotaReserved=(True, "QuotaReserved", ""), Admitted=(False, "NoChecks", "waiting")), False, False,
     "AdmissionChecksPending", None),
    (view(QuotaReserved=(True, "QuotaReserved", ""), Admitted=(True, "Admitted", "")), True, True, "Admitted", None),
    # Evicted while pods still run: stop them first, keep the quota until none is active.
    (view(QuotaReserved=(True, "", ""), Admitted=(True, "", ""), Evicted=(True, "Preempted", "by job-high")), True,
     False, "Preempted", None),
    (view(QuotaReserved=(True, "", ""), Admitted=(True, "", ""), Evicted=(True, "Preempted", "by job-high")), False,
     False, "Preempted", "Preempted"),
    # Evicted and the quota already given back: wait to be admitted again.
    (view(QuotaReserved=(False, "Pending", ""), Evicted=(True, "PodsReadyTimeout", "")), False, False, "Preempted",
     None),
    (view(Finished=(True, "Succeeded", "done")), False, False, "WorkloadFinished", None),
])
def test_gate(wl: WorkloadView | None, active: bool, run: bool, reason: str, clear: str | None) -> None:
    g = gate.decide("ddpjob-job-abcde", "q", wl, pods_active=active)
    assert (g.run, g.reason, g.clear_admission) == (run, reason, clear), g.message


def test_a_missing_priority_class_holds_the_job_with_the_fix() -> None:
    g = gate.decide("w", "q", None, pods_active=False, priority_missing="names WorkloadPriorityClass 'x' ...")
    assert (g.run, g.reason) == (False, "PriorityClassNotFound")


def queued(replicas: int = 2, labels: dict[str, str] | None = None) -> Any:
    job = make_job(replicas=replicas).with_checkpoint(existingClaim="ckpt")  # a preempted job must keep its steps
    job.body["metadata"]["labels"] = {kueue.QUEUE_LABEL: "q", **(labels or {})}
    return job


def test_a_queued_job_without_a_checkpoint_claim_is_refused_naming_the_fix() -> None:
    body = make_job().obj()
    body["metadata"]["labels"] = {kueue.QUEUE_LABEL: "q"}
    with pytest.raises(InvalidSpec) as err:
        parse_ddpjob(body)
    assert err.value.field == "spec.checkpoint" and "volumeClaim" in str(err.value) and "preempt" in str(err.value)
    c = KueueCluster(body)
    p = c.step(at(0))
    assert p.create_pods == [] and p.ensure == [] and c.status["state"] == st.FAILED


def test_workload_has_both_pod_sets_the_queue_and_the_priority() -> None:
    job = parse_ddpjob(queued(4).with_elastic(2, 4).obj())
    from ddpjob_operator.planner.children import builders
    wl = kueue.build_workload(job, builders.build_worker_pod(job, 0), builders.build_rendezvous_pod(job), ("hi", 900))
    assert wl["metadata"]["name"] == kueue.workload_name(job)
    assert wl["metadata"]["name"].startswith("ddpjob-job-") and len(wl["metadata"]["name"]) <= 63
    assert wl["metadata"]["labels"][kueue.JOB_UID_LABEL] == "uid-job"
    workers, rdzv = wl["spec"]["podSets"]
    assert (workers["name"], workers["count"], workers["minCount"]) == ("workers", 4, 2)
    assert (rdzv["name"], rdzv["count"]) == ("rendezvous", 1)
    assert "env" not in workers["template"]["spec"]["containers"][0]
    assert rdzv["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert wl["spec"]["queueName"] == "q" and wl["spec"]["priority"] == 900
    assert wl["spec"]["priorityClassRef"]["name"] == "hi"
    other = parse_ddpjob({**queued().obj(), "metadata": {"name": "job", "uid": "another"}})
    assert kueue.workload_name(other) != kueue.workload_name(job), "a job created again gets a new Workload"


class KueueCluster(FakeCluster):
    """FakeCluster whose plans see Kueue inputs (flavors) and whose Workload status the test sets."""

    inputs = KueueInputs(flavors={"spot": SPOT})

    def plan(self, now: Any) -> Plan:
        assert self.job is not None
        return plan(self.job, dataclasses.replace(self.observed(), kueue=self.inputs), now)

    @property
    def workload(self) -> Obj:
        return next(v for k, v in self.children.items() if k[0] == "Workload")

    def admit(self, workers: int | None = None) -> None:
        count = workers if workers is not None else self.workload["spec"]["podSets"][0]["count"]
        self.workload["status"] = {
            "conditions": [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": ""},
                           {"type": "Admitted", "status": "True", "reason": "Admitted", "message": ""}],
            "admission": {"clusterQueue": "cq", "podSetAssignments": [
                {"name": "workers", "count": count, "flavors": {"cpu": "spot"}},
                {"name": "rendezvous", "count": 1, "flavors": {"cpu": "spot"}}]}}

    def run_admitted(self) -> None:
        """Three passes: the Workload made, admitted, the pods created and Running."""
        self.step(at(0))
        self.admit()
        self.step(at(1))
        for pod in self.pods.values():
            pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        self.step(at(2))

    def evict(self) -> None:
        self.workload["status"]["conditions"].append(
            {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "Preempted to accommodate job-hi"})


def test_no_pod_before_admission_then_pods_on_the_admitted_flavor() -> None:
    c = KueueCluster(queued().obj())
    p = c.step(at(0))
    assert p.create_pods == [] and [o["kind"] for o in p.ensure][-1] == "Workload"
    assert c.status["state"] == st.QUEUED
    assert st.get_condition(c.status, st.QUEUED)["reason"] == "WorkloadCreated"  # type: ignore[index]
    c.step(at(1))
    assert c.pods == {} and st.condition_true(c.status, st.QUEUED)
    c.admit()
    p = c.step(at(2))
    assert sorted(c.pods) == ["job-rdzv", "job-worker-0", "job-worker-1"]
    for pod in c.pods.values():
        assert pod["spec"]["nodeSelector"] == {"pool": "spot"}
        assert TOLERATION in pod["spec"]["tolerations"]
    admitted = st.get_condition(c.status, "Admitted")
    assert admitted is not None and admitted["status"] == "True" and "ClusterQueue cq" in admitted["message"]
    assert not st.condition_true(c.status, st.QUEUED)
    assert any(e[1] == "Admitted" for e in c.events)


def test_elastic_job_partially_admitted_runs_the_admitted_count() -> None:
    c = KueueCluster(queued(4).with_elastic(2, 4).obj())
    c.step(at(0))
    assert c.workload["spec"]["podSets"][0]["minCount"] == 2
    c.admit(workers=3)
    c.step(at(1))
    assert sorted(n for n in c.pods if "worker" in n) == ["job-worker-0", "job-worker-1", "job-worker-2"]
    assert c.status["ready"] == "0/3"


def test_eviction_stops_the_pods_then_gives_the_quota_back_without_an_incident() -> None:
    c = KueueCluster(queued().obj())
    c.run_admitted()
    c.evict()
    p = c.step(at(3))
    assert sorted(d.reason for d in p.delete_pods) == ["Preempted"] * 3
    assert p.workload_writes == [], "the quota stays until no pod is active"
    assert c.status["state"] == st.QUEUED
    queued_cond = st.get_condition(c.status, st.QUEUED)
    assert queued_cond is not None and queued_cond["reason"] == "Preempted"
    assert "Preempted to accommodate job-hi" in queued_cond["message"]
    c.pods.clear()  # the kubelet ended them
    p = c.step(at(4))
    assert [(w.op, w.reason) for w in p.workload_writes] == [("clear", "Preempted")]
    assert p.create_pods == []
    assert c.status["incidentCount"] == 0 and c.status["restarts"] == 0


def test_a_deleted_workload_stops_the_pods_and_queues_the_job_again() -> None:
    c = KueueCluster(queued().obj())
    c.step(at(0))
    c.admit()
    c.step(at(1))
    assert c.pods
    del c.children[next(k for k in c.children if k[0] == "Workload")]
    p = c.step(at(2))
    assert len(p.delete_pods) == 3 and [o["kind"] for o in p.ensure] == ["Workload"]
    assert c.status["state"] == st.QUEUED
    c.admit()  # Kueue admits the new Workload at once, while the stopped pods still terminate
    c.step(at(3))
    c.step(at(4))
    assert c.status["incidentCount"] == 0, "pods the operator stopped are not losses"
    assert c.status["state"] != st.QUEUED and st.condition_true(c.status, "Admitted")


def test_a_missing_priority_class_creates_no_workload() -> None:
    c = KueueCluster(queued(labels={kueue.PRIORITY_LABEL: "nope"}).obj())
    c.inputs = KueueInputs(priority_missing="WorkloadPriorityClass 'nope' does not exist")
    p = c.step(at(0))
    assert [o["kind"] for o in p.ensure] == ["Service", "NetworkPolicy"] and p.create_pods == []
    assert st.get_condition(c.status, st.QUEUED)["reason"] == "PriorityClassNotFound"  # type: ignore[index]


def test_a_finished_job_marks_its_workload_finished() -> None:
    c = KueueCluster(queued().obj())
    c.step(at(0))
    c.admit()
    c.step(at(1))
    for name, pod in c.pods.items():
        pod["status"] = ({"phase": "Running"} if "rdzv" in name else {"phase": "Succeeded", "containerStatuses": [
            {"name": "worker", "state": {"terminated": {"exitCode": 0, "finishedAt": "2026-01-01T12:00:01Z"}}}]})
    p = c.step(at(100))
    assert c.status["state"] == st.SUCCEEDED
    assert [(w.op, w.succeeded) for w in p.workload_writes] == [("finish", True)]


def test_jobs_without_the_label_never_get_a_workload() -> None:
    c = KueueCluster(make_job().obj())
    p = c.step(at(0))
    assert "Workload" not in [o["kind"] for o in p.ensure] and len(p.create_pods) == 3
    assert st.get_condition(c.status, "Admitted") is None


def test_clear_admission_patch_gives_the_quota_back_conditionally() -> None:
    obj = {"metadata": {"resourceVersion": "42"}, "status": {"conditions": [
        {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": "",
         "lastTransitionTime": "t0"}]}}
    patch = admission.clear_admission_patch(obj, "Preempted", "evicted", at(1))
    assert patch["metadata"]["resourceVersion"] == "42" and patch["status"]["admission"] is None
    conds = {c["type"]: c for c in patch["status"]["conditions"]}
    assert conds["QuotaReserved"]["status"] == "False"
    assert conds["QuotaReserved"]["lastTransitionTime"] == format_time(at(1))
    assert conds["Admitted"]["status"] == "False" and conds["Requeued"]["status"] == "True"
    done = admission.finished_patch(obj, False, "failed", at(2))
    assert {c["type"]: c["reason"] for c in done["status"]["conditions"]}["Finished"] == "Failed"


def test_metrics_see_the_wait_and_the_eviction_once() -> None:
    from ddpjob_operator.planner.kueue.admission import transitions

    queued = {"state": "Queued", "conditions": [{"type": "Queued", "status": "True", "reason": "Pending",
                                                 "lastTransitionTime": "2026-01-01T12:00:00Z"}]}
    running = {"state": "Running", "conditions": [{"type": "Queued", "status": "False", "reason": "Admitted"}]}
    evicted = {"state": "Queued", "conditions": [{"type": "Queued", "status": "True", "reason": "Preempted",
                                                  "message": "evicted by Kueue (PodsReadyTimeout): ...",
                                                  "lastTransitionTime": "2026-01-01T12:00:30Z"}]}
    assert transitions(queued, running, at(42)) == (42.0, None)
    assert transitions(running, evicted, at(50)) == (None, "PodsReadyTimeout")
    assert transitions(evicted, evicted, at(51)) == (None, None), "counted once, not every pass"
    assert transitions(queued, queued, at(60)) == (None, None)


def test_pods_ready_false_until_every_pod_runs_then_true_through_a_recovery() -> None:
    c = KueueCluster(queued().obj())
    c.step(at(0))
    c.admit()
    p = c.step(at(1))
    assert [(w.op, w.succeeded, w.reason) for w in p.workload_writes] == [("podsready", False, "WaitForStart")]
    c.workload["status"]["conditions"].append({"type": "PodsReady", "status": "False", "reason": "WaitForStart"})
    for pod in c.pods.values():
        pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    p = c.step(at(2))
    assert c.status["state"] == st.RUNNING
    assert [(w.op, w.succeeded, w.reason) for w in p.workload_writes] == [("podsready", True, "Started")]
    c.workload["status"]["conditions"][-1] = {"type": "PodsReady", "status": "True", "reason": "Started"}
    c.set_phase("job-worker-1", "Failed", exit_code=137, finished=at(3))
    p = c.step(at(3))
    assert c.status["state"] == st.RESTARTING and p.workload_writes == [], "a recovery keeps PodsReady True"
    patch = admission.clear_admission_patch(c.workload, "Preempted", "evicted", at(4))
    ready = {x["type"]: x for x in patch["status"]["conditions"]}["PodsReady"]
    assert (ready["status"], ready["reason"]) == ("False", "WaitForStart"), "admitted again, it must start again"

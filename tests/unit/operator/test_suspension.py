"""Suspend of a job in a Kueue queue (kueue/suspension.py): its Workload is deactivated, the quota given back once no
pod is active, and activated again on resume only when the operator deactivated it; on a MultiKueue manager the same
writes stop the copy, and the manager's status says Suspended. Table tests of the policy, then planner scenarios on
test_kueue's in-memory cluster."""

from __future__ import annotations

import pytest
from ddpjob_operator.api.spec import MULTIKUEUE_MANAGER
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.kueue import suspension
from ddpjob_operator.planner.kueue import workload as kueue
from ddpjob_operator.planner.kueue.workload import Condition, WorkloadView
from ddpjob_operator.runtime import kueue_sync

from .factories import at
from .test_kueue import KueueCluster, queued

EVICTED = {"Evicted": Condition(True, "Deactivated", "The workload is deactivated")}


def view(*, active: bool = True, ours: bool = False, holding: bool = True, evicted: bool = False) -> WorkloadView:
    return WorkloadView(conditions=EVICTED if evicted else {}, cluster_queue="cq" if holding else None,
                        assignments={}, updates={}, active=active, suspended_by_job=ours)


@pytest.mark.parametrize(("wl", "suspended", "pods_active", "ops"), [
    (None, True, False, []),  # no Workload yet: made active, deactivated on the next pass
    (view(), True, True, ["deactivate"]),
    (view(active=False, ours=True), True, True, []),  # Kueue has not evicted it yet
    (view(active=False, ours=True, evicted=True), True, True, []),  # the pods first (each checkpoints on SIGTERM)
    (view(active=False, ours=True, evicted=True), True, False, ["clear"]),
    (view(active=False, ours=True, evicted=True, holding=False), True, False, []),  # given back already
    (view(), False, False, []),
    (view(active=False, ours=True, evicted=True, holding=False), False, False, ["activate"]),
    # Deactivated by Kueue (MultiKueue's eviction on the manager, a rejected check) or an admin: left inactive.
    (view(active=False, evicted=True, holding=False), False, False, []),
])
def test_writes(wl: WorkloadView | None, suspended: bool, pods_active: bool, ops: list[str]) -> None:
    writes = suspension.writes("wl", wl, suspended=suspended, pods_active=pods_active)
    assert [w.op for w in writes] == ops
    assert all(w.name == "wl" for w in writes)


def test_the_view_reads_spec_active_and_the_operators_mark() -> None:
    obj = {"metadata": {"annotations": {kueue.SUSPENDED_ANNOTATION: "true"}}, "spec": {"active": False}}
    v = WorkloadView.from_object(obj)
    assert (v.active, v.suspended_by_job) == (False, True)
    v = WorkloadView.from_object({"spec": {}})
    assert (v.active, v.suspended_by_job) == (True, False), "spec.active defaults to true"


def test_the_patches_set_spec_active_and_the_mark_conditionally() -> None:
    obj = {"metadata": {"resourceVersion": "7"}, "spec": {"active": True}}
    assert kueue_sync._activity(obj, "deactivate") == {
        "metadata": {"resourceVersion": "7", "annotations": {kueue.SUSPENDED_ANNOTATION: "true"}},
        "spec": {"active": False}}
    assert kueue_sync._activity(obj, "activate") == {
        "metadata": {"resourceVersion": "7", "annotations": {kueue.SUSPENDED_ANNOTATION: None}},
        "spec": {"active": True}}


def _suspend(c: KueueCluster, value: bool) -> None:
    c.jobobj["spec"].setdefault("runPolicy", {})["suspend"] = value


def _deactivated_by_kueue(c: KueueCluster, ours: bool) -> None:
    """What Kueue does with spec.active false (the operator's patch applied): Evicted, reason Deactivated."""
    wl = c.workload
    wl["spec"]["active"] = False
    if ours:
        wl["metadata"].setdefault("annotations", {})[kueue.SUSPENDED_ANNOTATION] = "true"
    wl["status"]["conditions"].append(
        {"type": "Evicted", "status": "True", "reason": "Deactivated", "message": "The workload is deactivated"})


def _quota_given_back(c: KueueCluster) -> None:
    c.workload["status"] = {"conditions": [
        {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": ""},
        {"type": "Evicted", "status": "True", "reason": "Deactivated", "message": "The workload is deactivated"}]}


def test_a_suspended_queued_job_deactivates_its_workload_gives_the_quota_back_and_reactivates_it() -> None:
    c = KueueCluster(queued().obj())
    c.run_admitted()
    _suspend(c, True)
    p = c.step(at(3))
    assert sorted(d.reason for d in p.delete_pods) == ["Suspended"] * 3
    assert [w.op for w in p.workload_writes] == ["deactivate"] and c.status["state"] == st.SUSPENDED
    _deactivated_by_kueue(c, ours=True)
    c.pods.clear()  # the pods went (each wrote its checkpoint on SIGTERM)
    p = c.step(at(4))
    assert [(w.op, w.reason) for w in p.workload_writes] == [("clear", "Deactivated")]
    _quota_given_back(c)
    assert c.step(at(5)).workload_writes == [], "nothing more while suspended"
    _suspend(c, False)
    p = c.step(at(6))
    assert [w.op for w in p.workload_writes] == ["activate"]
    assert c.pods == {} and c.status["state"] == st.QUEUED, "it waits to be admitted again, like any queued job"


def test_a_workload_deactivated_by_someone_else_stays_inactive_after_a_resume() -> None:
    c = KueueCluster(queued().obj())
    c.run_admitted()
    _deactivated_by_kueue(c, ours=False)  # an admin's kubectl patch, or MultiKueue's eviction on the manager
    c.pods.clear()
    _quota_given_back(c)
    _suspend(c, True)
    assert c.step(at(3)).workload_writes == []
    _suspend(c, False)
    p = c.step(at(4))
    assert p.workload_writes == [] and c.pods == {} and c.status["state"] == st.QUEUED


def test_a_suspend_on_the_manager_deactivates_the_workload_and_says_suspended() -> None:
    job = queued().obj()
    job["spec"]["managedBy"] = MULTIKUEUE_MANAGER
    c = KueueCluster(job)
    c.step(at(0))
    c.admit()
    c.jobobj["status"] = {"state": st.RUNNING, "ready": "2/2", "progress": {"globalStep": 7}}  # the copy's, mirrored
    assert c.step(at(1)).patch == {}, "running: the status is the copy's"
    _suspend(c, True)
    p = c.step(at(2))
    assert [w.op for w in p.workload_writes] == ["deactivate"] and p.dispatch_only and p.create_pods == []
    assert p.patch["state"] == st.SUSPENDED and c.status["state"] == st.SUSPENDED
    _deactivated_by_kueue(c, ours=True)
    p = c.step(at(3))
    assert [w.op for w in p.workload_writes] == ["clear"], "no pod here: the quota goes back, MultiKueue drops the copy"
    _quota_given_back(c)
    _suspend(c, False)
    p = c.step(at(4))
    assert [w.op for w in p.workload_writes] == ["activate"] and p.patch == {}

"""MultiKueue (issue 45): a DDPJob that MultiKueue dispatches gets only its Workload on the manager cluster
(kueue/multikueue.py), and its copy in the worker cluster runs under the Workload Kueue made for it there (the
prebuilt Workload: used and adopted, never a second one). Planner scenarios on the in-memory cluster of test_kueue."""

from __future__ import annotations

import pytest
from ddpjob_operator.api.spec import MULTIKUEUE_MANAGER, InvalidSpec, parse_ddpjob
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.kueue import workload as kueue

from .factories import at, make_job
from .test_kueue import KueueCluster, queued

PREBUILT = "ddpjob-job-1a2b3"


def manager_job() -> KueueCluster:
    job = queued().obj()
    job["spec"]["managedBy"] = MULTIKUEUE_MANAGER
    return KueueCluster(job)


def test_the_manager_makes_the_workload_and_nothing_else_through_admission_and_eviction() -> None:
    c = manager_job()
    p = c.step(at(0))
    assert [o["kind"] for o in p.ensure] == ["Workload"] and p.dispatch_only
    assert p.create_pods == p.check_pods == [] and p.patch == {} and p.events == []
    assert c.status == {}, "the status is the worker cluster's, copied by MultiKueue"
    assert c.workload["metadata"]["name"] == kueue.workload_name(parse_ddpjob(c.jobobj))
    c.admit()  # MultiKueue's admission check is Ready: the copy runs in a worker cluster
    for t in (1, 2):
        p = c.step(at(t))
        assert c.pods == {} and p.create_pods == p.ensure == [] and p.patch == {} and p.workload_writes == []
    c.evict()  # e.g. the worker cluster was lost past MultiKueue's workerLostTimeout
    p = c.step(at(3))
    assert [(w.op, w.reason) for w in p.workload_writes] == [("clear", "Preempted")], \
        "no pod here: the quota goes back at once and MultiKueue dispatches the job again"
    assert c.status == {} and c.pods == {}


def test_the_manager_leaves_a_finished_copys_workload_to_multikueue() -> None:
    c = manager_job()
    c.step(at(0))
    c.admit()
    c.jobobj["status"] = {"state": st.SUCCEEDED, "completionTime": "2026-12-06T12:00:00Z", "conditions": [
        {"type": st.SUCCEEDED, "status": "True", "reason": "AllWorkersSucceeded", "message": "done"}]}  # copied
    p = c.step(at(10))
    assert p.workload_writes == [] and p.delete_pods == [] and p.patch == {}


def test_multikueue_without_a_queue_is_refused_naming_the_label() -> None:
    job = make_job().obj()
    job["spec"]["managedBy"] = MULTIKUEUE_MANAGER
    with pytest.raises(InvalidSpec) as err:
        parse_ddpjob(job)
    assert err.value.field == "spec.managedBy" and kueue.QUEUE_LABEL in err.value.message
    c = KueueCluster(job)
    p = c.step(at(0))
    assert p.ensure == [] and p.create_pods == [] and c.status["state"] == st.FAILED, "said in the job's status"


def worker_copy(owned: bool = False) -> KueueCluster:
    """The copy MultiKueue made in a worker cluster: no managedBy, the prebuilt label, and the Workload it made first
    (its labels copied from the manager's, no owner)."""
    c = KueueCluster(queued(labels={kueue.PREBUILT_LABEL: PREBUILT, "kueue.x-k8s.io/multikueue-origin": "mgr"}).obj())
    job = parse_ddpjob(c.jobobj)
    from ddpjob_operator.planner.children import builders
    wl = kueue.build_workload(job, builders.build_worker_pod(job, 0), builders.build_rendezvous_pod(job), None)
    wl["metadata"].update(name=PREBUILT, uid="wl-uid")
    if owned:
        wl["metadata"]["ownerReferences"] = [builders.owner_reference(c.jobobj)]
    c.children[("Workload", PREBUILT)] = wl
    return c


def test_a_worker_copy_adopts_the_prebuilt_workload_and_makes_none_of_its_own() -> None:
    c = worker_copy()
    p = c.step(at(0))
    assert "Workload" not in [o["kind"] for o in p.ensure]
    assert [(w.op, w.name) for w in p.workload_writes] == [("adopt", PREBUILT)]
    assert c.pods == {} and c.status["state"] == st.QUEUED
    assert [k for k in c.children if k[0] == "Workload"] == [("Workload", PREBUILT)]


def test_a_worker_copy_runs_when_kueue_admits_the_prebuilt_workload() -> None:
    c = worker_copy(owned=True)
    c.step(at(0))
    c.admit()
    p = c.step(at(1))
    assert sorted(c.pods) == ["job-rdzv", "job-worker-0", "job-worker-1"]
    assert [w.op for w in p.workload_writes] == ["podsready"], "owned already: no second adoption"
    assert st.condition_true(c.status, "Admitted")
    c.evict()  # the worker cluster's own preemption: stop, then give the quota back, as for any queued job
    p = c.step(at(2))
    assert sorted(d.reason for d in p.delete_pods) == ["Preempted"] * 3


def test_the_adoption_patch_adds_the_job_as_controller_conditionally() -> None:
    from ddpjob_operator.runtime.kueue_sync import _owned

    job = {"apiVersion": "ddpjob.io/v1alpha1", "kind": "DDPJob", "metadata": {"name": "job", "uid": "uid-job"}}
    patch = _owned({"metadata": {"name": PREBUILT, "resourceVersion": "42"}}, job)
    assert patch["metadata"]["resourceVersion"] == "42", "a Workload changed meanwhile is left for the next pass"
    (ref,) = patch["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == ("DDPJob", "job", "uid-job", True)

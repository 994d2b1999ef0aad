"""Planner scenarios of fault *sequences* on the in-memory cluster: incidents counted once per cause, recovery,
stalls, deleted and foreign children."""

from __future__ import annotations

import dataclasses

import pytest
from ddpjob_operator.api.formats import format_time
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.plan import plan

from .factories import FakeCluster, at, make_job, pod_obj, running_cluster

pytestmark = pytest.mark.unit


def lose_rendezvous(c: FakeCluster, t: float) -> None:
    """What a real cluster does: the store pod is deleted, then every agent exits 200, then pods get replaced."""
    c.user_delete("job-rdzv", at=at(t))
    c.converge(at(t))
    for name in c.worker_names():
        c.set_phase(name, "Failed", exit_code=200, finished=at(t + 2),
                    message="RendezvousConnectionError: the store at job-rdzv.job.ns.svc:29400 is unreachable")
    c.converge(at(t + 3))
    c.finish_terminations()
    c.converge(at(t + 4))
    c.run_all()
    c.converge(at(t + 5))


def test_rendezvous_loss_counts_once_for_four_workers_and_the_fourth_loss_fails() -> None:
    c = running_cluster(replicas=4, backoffLimit=3)
    for n, t in enumerate((100, 200, 300), start=1):
        lose_rendezvous(c, t)
        assert c.status["incidentCount"] == n, c.status.get("incidents")
        assert c.status["state"] == "Running"
        assert c.status["incidents"][-1]["cause"] == "RendezvousLost"
        assert sorted(c.status["incidents"][-1]["pods"]) == sorted(["job-rdzv", *c.worker_names()])
    assert c.status["restarts"] == 12  # pods replaced: 4 per loss
    lose_rendezvous(c, 400)
    failed = st.get_condition(c.status, "Failed")
    assert failed is not None and failed["reason"] == "BackoffLimitExceeded"
    assert failed["message"].startswith("4 incidents exceed spec.runPolicy.backoffLimit (3): #1 RendezvousLost")
    assert "#4 RendezvousLost" in failed["message"]
    assert c.status["incidents"][-1]["outcome"] == "Failed"


def test_deleted_worker_is_an_incident_replaced_once_gone_and_recovered_with_progress() -> None:
    c = running_cluster(replicas=2)
    c.jobobj["status"]["progress"] = {"globalStep": 40, "updateTime": format_time(at(5))}
    c.user_delete("job-worker-1", at=at(10))
    p = c.step(at(10))
    assert p.create_pods == [] and c.status["incidentCount"] == 1
    assert c.status["incidents"][0]["cause"] == "PodDeleted" and c.status["state"] == "Restarting"
    c.finish_terminations()
    p = c.step(at(12))
    assert [o["metadata"]["name"] for o in p.create_pods] == ["job-worker-1"]
    assert p.create_pods[0]["metadata"]["labels"]["ddpjob.io/incident-generation"] == "1"
    c.run_all(started=at(12))
    c.step(at(13))
    assert c.status["incidents"][0]["outcome"] == "Recovering", "no progress reported since the incident yet"
    c.jobobj["status"]["progress"] = {"globalStep": 50, "updateTime": format_time(at(20))}
    p = c.step(at(21))
    inc = c.status["incidents"][0]
    assert inc["outcome"] == "Recovered" and inc["recoverySeconds"] == 10
    assert any(e.reason == "IncidentRecovered" and "recovered in 10s" in e.message for e in p.events)
    assert c.status["incidentCount"] == 1


def test_force_deleted_worker_seen_only_as_a_tombstone_is_counted_and_replaced() -> None:
    c = running_cluster(replicas=2)
    c.user_delete("job-worker-0", force=True, at=at(10))
    p = c.step(at(10))
    assert c.status["incidentCount"] == 1
    assert [o["metadata"]["name"] for o in p.create_pods] == ["job-worker-0"]
    c.converge(at(11))
    assert c.status["incidentCount"] == 1, "a tombstone is counted once"


def test_a_crash_loop_of_one_worker_exhausts_the_budget() -> None:
    c = running_cluster(replicas=2, backoffLimit=2)
    for t in (10, 20, 30):
        c.set_phase("job-worker-1", "Failed", exit_code=137, finished=at(t))
        c.converge(at(t))
        if st.condition_true(c.status, "Failed"):
            break
        c.run_all()
    assert c.status["incidentCount"] == 3 and st.condition_true(c.status, "Failed")


def test_the_stalled_condition_says_which_clock_runs_from_the_start() -> None:
    c = running_cluster(replicas=2, progressDeadlineSeconds=30, startupDeadlineSeconds=600)
    c.step(at(100))  # past the step deadline, within the start-up allowance: no step yet
    stalled = st.get_condition(c.status, "Stalled")
    assert stalled is not None and (stalled["status"], stalled["reason"]) == ("False", "StartingUp")
    assert "allowed until 2026-01-01T12:10:00Z (startupDeadlineSeconds 600)" in stalled["message"]
    c.jobobj["status"]["progress"] = {"globalStep": 3, "source": "OptimizerSteps",
                                      "lastStepTime": "2026-01-01T12:01:45.000Z"}
    c.step(at(110))
    stalled = st.get_condition(c.status, "Stalled")
    assert stalled is not None and (stalled["status"], stalled["reason"]) == ("False", "Progressing")
    assert c.status.get("incidentCount", 0) == 0


def test_running_workers_of_a_command_the_runtime_cannot_see_are_never_restarted_at_start_up() -> None:
    job = make_job(replicas=2).with_run_policy(progressDeadlineSeconds=30, startupDeadlineSeconds=30)
    job.body["spec"]["template"]["spec"]["containers"][0]["args"] = ["bash", "train.sh"]
    c = FakeCluster(job.obj())
    c.converge(at(0))
    c.run_all()
    c.converge(at(1))
    p = c.step(at(5000))
    stalled = st.get_condition(c.status, "Stalled")
    assert stalled is not None and stalled["status"] == "False" and stalled["reason"] == "StepsNotVisible"
    assert p.delete_pods == [] and c.status.get("incidentCount", 0) == 0


def test_stall_with_on_stall_fail_fails_the_job() -> None:
    c = running_cluster(replicas=2, progressDeadlineSeconds=30, startupDeadlineSeconds=30, onStall="Fail")
    c.step(at(40))
    failed = st.get_condition(c.status, "Failed")
    assert failed is not None and failed["reason"] == "ProgressDeadlineExceeded"


def test_pending_pods_are_reported_as_stalled_but_never_restarted() -> None:
    job = make_job(replicas=2).with_run_policy(progressDeadlineSeconds=30, startupDeadlineSeconds=30)
    c = FakeCluster(job.obj())
    c.converge(at(0))
    p = c.step(at(31))
    stalled = st.get_condition(c.status, "Stalled")
    assert stalled is not None and stalled["reason"] == "PodsPending" and "job-worker-0 (Pending)" in stalled["message"]
    assert p.delete_pods == [] and c.status.get("incidentCount", 0) == 0


def test_deleted_service_is_created_again_with_an_event() -> None:
    c = running_cluster(replicas=2)
    del c.children[("Service", "job")]
    p = c.step(at(5))
    assert [o["kind"] for o in p.ensure] == ["Service"]
    assert any(e.reason == "ChildRecreated" and "Service job" in e.message for e in p.events)
    assert c.status.get("incidentCount", 0) == 0


def test_foreign_pod_with_a_workers_name_is_a_conflict_and_never_touched() -> None:
    c = running_cluster(replicas=2)
    foreign = pod_obj(c.jobobj, 1, "Running", owner={"metadata": {"name": "other", "uid": "other-uid"}})
    c.user_delete("job-worker-1", force=True, at=at(5))
    c.pods["job-worker-1"] = foreign
    p = c.step(at(6))
    conflict = st.get_condition(c.status, "ChildConflict")
    assert conflict is not None and conflict["status"] == "True" and "Pod job-worker-1" in conflict["message"]
    assert p.create_pods == [] and all(d.uid != foreign["metadata"]["uid"] for d in p.delete_pods)


@pytest.mark.parametrize(("name", "cause"), [("job-worker-1", "PodDeleted"), ("job-rdzv", "RendezvousLost")])
def test_a_pod_lost_while_no_operator_watched_is_counted_once_before_it_is_created_again(name: str, cause: str) -> None:
    c = running_cluster(replicas=3)
    del c.pods[name]  # deleted while the operator was down: no Terminating state, no tombstone
    first = dataclasses.replace(c.observed(), first_pass=True)
    p = plan(c.jobobj, first, at(30))
    assert p.status["incidentCount"] == 1 and p.status["incidents"][0]["cause"] == cause
    assert "no operator was watching" in p.status["incidents"][0]["message"]
    assert name not in [o["metadata"]["name"] for o in p.create_pods], "created only once its count is written"
    assert p.requeue_after == 0, "the next pass, at once, creates it"
    c.apply(p, write_status=False)  # the write refused (or the operator gone): the next first pass counts it again
    again = plan(c.jobobj, first, at(31))
    assert [(i["id"], i["pods"]) for i in again.status["incidents"]] == [(1, [name])]
    assert again.status["incidentCount"] == 1 and name not in [o["metadata"]["name"] for o in again.create_pods]
    c.apply(again)
    taken_over = plan(c.jobobj, dataclasses.replace(c.observed(), first_pass=True), at(32))  # another takeover
    assert taken_over.status["incidentCount"] == 1, "the written loss of a pod still missing is not counted again"
    assert name in [o["metadata"]["name"] for o in taken_over.create_pods]
    later = plan(c.jobobj, c.observed(), at(32))
    assert later.status["incidentCount"] == 1 and name in [o["metadata"]["name"] for o in later.create_pods]
    c.apply(later)
    c.run_all(started=at(33))
    c.step(at(34))
    assert not any(u.startswith("vanished-") for u in c.status.get("countedFailures") or []), \
        "its loss leaves the counted list once the pod exists again"
    del c.pods[name]  # lost again during the next takeover: a new loss
    second = plan(c.jobobj, dataclasses.replace(c.observed(), first_pass=True), at(90))
    assert second.status["incidentCount"] == 2 and second.status["incidents"][-1]["cause"] == cause
    outside = plan(c.jobobj, c.observed(), at(90))
    assert outside.status.get("incidentCount") == 1, "outside the first pass a missing pod is only recreated"


def test_scale_up_is_not_a_loss_on_the_first_pass() -> None:
    c = FakeCluster(make_job(replicas=2).with_elastic(2, 4).obj())
    c.converge(at(0))
    c.run_all()
    c.converge(at(1))
    c.jobobj["spec"]["replicas"] = 4
    p = plan(c.jobobj, dataclasses.replace(c.observed(), first_pass=True), at(5))
    assert p.status.get("incidentCount", 0) == 0
    assert sorted(o["metadata"]["name"] for o in p.create_pods) == ["job-worker-2", "job-worker-3"]


def test_a_lost_store_trained_through_recovers_and_reopens_when_the_agents_exit_after_all() -> None:
    """The agents keep a healthy group training through a lost store (ddpjob_worker.storekeeper): steps reported
    after the new store started close the incident. An agent that could not reconnect exits 200 later: that is
    the same incident, reopened, and it closes again once a group formed after it steps."""
    c = running_cluster(replicas=2)
    c.user_delete("job-rdzv", at=at(10))
    c.finish_terminations()
    c.converge(at(11))
    c.run_all(started=at(11))  # the new store runs; the workers are still the old ones (started at T0)
    c.jobobj["status"]["progress"] = {"globalStep": 30, "updateTime": format_time(at(12))}
    p = c.step(at(13))
    assert c.status["incidents"][0]["outcome"] == "Recovered" and c.status["incidents"][0]["recoverySeconds"] == 3
    assert [e.message for e in p.events if e.reason == "IncidentRecovered"] == [
        "incident #1 (RendezvousLost) recovered in 3s, training at global step 30"]
    for name in c.worker_names():
        c.set_phase(name, "Failed", exit_code=200, finished=at(14))
    c.converge(at(15))
    c.run_all(started=at(16))
    c.jobobj["status"]["progress"] = {"globalStep": 28, "updateTime": format_time(at(20))}
    p = c.step(at(21))
    inc = c.status["incidents"][0]
    assert c.status["incidentCount"] == 1 and inc["outcome"] == "Recovered" and inc["recoverySeconds"] == 10
    assert [e.message for e in p.events if e.reason == "IncidentRecovered"] == [
        "incident #1 (RendezvousLost) recovered in 10s, training at global step 28"]

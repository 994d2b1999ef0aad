"""Table-driven and scenario tests of the pure planner, applied to an in-memory cluster."""

from __future__ import annotations

from typing import Any

import pytest
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.plan import Observed, plan

from .factories import FakeCluster, at, make_job, pod_obj, running_cluster, views


def cond(status: dict[str, Any], ctype: str) -> dict[str, Any]:
    c = st.get_condition(status, ctype)
    assert c is not None, f"no {ctype} condition in {status.get('conditions')}"
    return dict(c)


def test_new_job_creates_rendezvous_workers_and_children() -> None:
    p = plan(make_job(replicas=2).obj(), Observed(), at(0))
    names = [o["metadata"]["name"] for o in p.create_pods]
    assert names == ["job-rdzv", "job-worker-0", "job-worker-1"]
    assert [o["kind"] for o in p.ensure] == ["Service", "NetworkPolicy"]
    assert p.status["state"] == "Created"
    assert p.status["restarts"] == 0
    assert p.status["startTime"] == "2026-01-01T12:00:00Z"
    assert p.status["selector"] == "ddpjob.io/job-name=job,ddpjob.io/replica-type=worker"
    assert cond(p.status, "Created")["reason"] == "JobCreated"
    assert p.events == [], "no Event for a routine creation (500 jobs would post 500)"


def test_running_when_all_workers_and_store_run() -> None:
    c = running_cluster()
    assert c.status["state"] == "Running"
    assert cond(c.status, "Running")["status"] == "True"
    assert c.status["ready"] == "2/2"
    assert any(e[1] == "AllWorkersRunning" for e in c.events)


def test_second_identical_pass_writes_nothing() -> None:
    c = running_cluster()
    p = c.plan(at(5))
    assert p.patch == {} and p.create_pods == [] and p.delete_pods == [] and p.events == []


@pytest.mark.parametrize("crash_after", [0, 1, 5, 16])
def test_operator_restart_mid_creation_never_duplicates(crash_after: int) -> None:
    c = FakeCluster(make_job(replicas=16).obj())
    c.step(at(0), crash_after_creates=crash_after, write_status=False)
    c.converge(at(1))
    assert c.worker_names() == sorted(f"job-worker-{i}" for i in range(16))
    assert c.created == 17  # 16 workers + the rendezvous pod, each exactly once
    assert c.plan(at(2)).create_pods == []


def test_retryable_failure_is_counted_then_replaced() -> None:
    c = running_cluster()
    c.set_phase("job-worker-1", "Failed", exit_code=137, finished=at(10))
    failed_uid = c.pods["job-worker-1"]["metadata"]["uid"]
    p1 = c.step(at(11))
    # Counted first, deleted only after the count is written, by the next pass, asked for at once: the failed
    # pod's status may have been its last event, and the echo of the status write plans nothing.
    assert p1.delete_pods == [] and p1.create_pods == [] and p1.requeue_after == 0
    assert c.status["restarts"] == 1 and c.status["countedFailures"] == [failed_uid]
    assert c.status["state"] == "Restarting"
    assert ("Warning", "WorkerFailed") in [(t, r) for t, r, _ in c.events]
    assert any("exit code 137" in m for _, _, m in c.events)
    p2 = c.step(at(12))
    assert [d.uid for d in p2.delete_pods] == [failed_uid]
    assert [o["metadata"]["name"] for o in p2.create_pods] == ["job-worker-1"]
    assert p2.create_pods[0]["metadata"]["labels"]["ddpjob.io/restart-generation"] == "1"
    assert p2.replacements[0].exit_code == 137
    assert any(r == "WorkerReplaced" and "exit code 137" in m for _, r, m in c.events)
    c.run_all()
    c.converge(at(13))
    assert c.status["restarts"] == 1
    assert c.status["state"] == "Running"
    assert cond(c.status, "Restarting")["status"] == "False"
    assert "countedFailures" not in c.status


def test_crash_before_status_write_does_not_double_count() -> None:
    c = running_cluster()
    c.set_phase("job-worker-0", "Failed", exit_code=143)
    c.step(at(11), write_status=False)  # operator SIGKILLed before its status write
    c.step(at(12))
    c.step(at(13))
    assert c.status["restarts"] == 1


def test_stale_status_read_never_lowers_restarts() -> None:
    c = running_cluster()
    c.set_phase("job-worker-0", "Failed", exit_code=137)
    c.converge(at(11), passes=3)
    assert c.status["restarts"] == 1
    c.run_all()
    c.jobobj["status"]["restarts"] = 0  # e.g. a watch event older than our own write
    p = c.plan(at(12))
    assert p.status["restarts"] == 1  # the replacement's restart-generation label remembers it


def test_restarts_floor_from_memory() -> None:
    job = make_job().with_status(restarts=2).obj()
    p = plan(job, Observed(restarts_floor=5), at(0))
    assert p.status["restarts"] == 5


def test_permanent_exit_code_fails_with_message_and_cleans_running_pods() -> None:
    c = running_cluster()
    c.set_phase("job-worker-1", "Failed", exit_code=78, message="PET_RDZV_ENDPOINT is not set")
    p = c.step(at(20))
    failed = cond(c.status, "Failed")
    assert failed["status"] == "True" and failed["reason"] == "PermanentExitCode"
    assert "exit code 78" in failed["message"] and "PET_RDZV_ENDPOINT is not set" in failed["message"]
    assert c.status["completionTime"] == "2026-01-01T12:00:20Z"
    assert sorted(d.name for d in p.delete_pods) == ["job-rdzv", "job-worker-0"]  # cleanPodPolicy Running
    assert cond(c.status, "Running")["status"] == "False"
    assert c.plan(at(21)).create_pods == []


def test_a_secret_in_a_workers_last_words_is_masked_in_status_and_events() -> None:
    c = running_cluster()
    secret = "https://bob:hunter2@data.example/shard?X-Amz-Signature=0f1e2d3c"
    c.set_phase("job-worker-1", "Failed", exit_code=78, message=f"HTTPError 403 for {secret}")
    p = c.step(at(20))
    copies = [cond(c.status, "Failed")["message"], *(i["message"] for i in c.status["incidents"]),
              *(e.message for e in p.events)]
    assert any("HTTPError 403 for https://bob:***@data.example/shard?X-Amz-Signature=***" in m for m in copies)
    assert not [m for m in copies if "hunter2" in m or "0f1e2d3c" in m], copies


@pytest.mark.parametrize(
    ("policy", "code", "fails"),
    [
        ({}, 1, True),
        ({}, 127, True),
        ({}, 137, False),
        ({"retryableExitCodes": [1]}, 1, False),
        ({"permanentExitCodes": [137]}, 137, True),
    ],
)
def test_exit_code_policy_in_planner(policy: dict[str, Any], code: int, fails: bool) -> None:
    c = running_cluster(**policy)
    c.set_phase("job-worker-0", "Failed", exit_code=code)
    c.step(at(30))
    assert st.condition_true(c.status, "Failed") is fails


@pytest.mark.parametrize(("limit", "failures_ok"), [(0, 0), (1, 1), (3, 3)])
def test_backoff_limit(limit: int, failures_ok: int) -> None:
    c = running_cluster(backoffLimit=limit)
    for n in range(failures_ok + 1):
        assert not st.condition_true(c.status, "Failed"), f"failed early at failure {n}"
        c.set_phase("job-worker-0", "Failed", exit_code=137)
        c.converge(at(40 + n), passes=2)
        c.run_all()
        c.converge(at(40 + n), passes=1)
    failed = cond(c.status, "Failed")
    assert failed["reason"] == "BackoffLimitExceeded"
    assert c.status["restarts"] == failures_ok + 1


def test_suspend_deletes_pods_keeps_counts_and_resume_recreates() -> None:
    c = running_cluster()
    c.set_phase("job-worker-0", "Failed", exit_code=137)
    c.converge(at(5), passes=2)
    c.run_all()
    c.jobobj["spec"]["runPolicy"] = {"suspend": True}
    c.converge(at(10))
    assert all("deletionTimestamp" in p["metadata"] for p in c.pods.values())
    c.finish_terminations()
    c.converge(at(10))
    assert c.pods == {}
    assert c.status["state"] == "Suspended" and c.status["restarts"] == 1
    assert "startTime" not in c.status
    assert cond(c.status, "Suspended")["status"] == "True"
    c.jobobj["spec"]["runPolicy"] = {"suspend": False}
    c.converge(at(20))
    assert len(c.worker_names()) == 2 and "job-rdzv" in c.pods
    assert cond(c.status, "Suspended")["reason"] == "Resumed"
    assert c.status["startTime"] == "2026-01-01T12:00:20Z"
    assert c.status["restarts"] == 1


def test_elastic_scale_down_and_up() -> None:
    c = FakeCluster(make_job(replicas=4).with_elastic(2, 4).obj())
    c.converge(at(0))
    c.run_all()
    c.jobobj["spec"]["replicas"] = 2
    p = c.step(at(1))
    assert sorted(d.name for d in p.delete_pods) == ["job-worker-2", "job-worker-3"]
    assert all(not d.force for d in p.delete_pods)
    c.finish_terminations()
    c.converge(at(2))
    assert c.status["ready"] == "2/2" and c.status["state"] == "Running"
    c.jobobj["spec"]["replicas"] = 4
    c.converge(at(3))
    assert c.worker_names() == [f"job-worker-{i}" for i in range(4)]
    assert c.status["restarts"] == 0


def test_deadline_exceeded() -> None:
    c = running_cluster(activeDeadlineSeconds=60)
    p = c.plan(at(30))
    assert p.requeue_after == pytest.approx(30)
    c.step(at(61))
    failed = cond(c.status, "Failed")
    assert failed["reason"] == "DeadlineExceeded"
    assert "activeDeadlineSeconds (60s)" in failed["message"]


def test_success_then_ttl_deletes_job() -> None:
    c = running_cluster(ttlSecondsAfterFinished=30)
    for name in c.worker_names():
        c.set_phase(name, "Succeeded")
    p = c.step(at(100))
    assert cond(c.status, "Succeeded")["reason"] == "WorkersSucceeded"
    assert c.status["completionTime"] == "2026-01-01T12:01:40Z"
    assert [d.name for d in p.delete_pods] == ["job-rdzv"]
    assert p.requeue_after == pytest.approx(30)
    p = c.step(at(110))
    assert not p.delete_job and p.requeue_after == pytest.approx(20)
    assert c.step(at(131)).delete_job


def test_a_finished_jobs_conditions_say_it_is_finished() -> None:
    """Not the last running pass's words: "Stalled=False Finishing ... allowed until <30 min later>" (issue 43)."""
    c = running_cluster()
    c.jobobj["status"]["progress"] = {"globalStep": 9, "lastStepTime": "2026-01-01T12:00:09Z",
                                      "finishTime": "2026-01-01T12:00:10Z"}
    c.step(at(11))
    assert cond(c.status, "Stalled")["reason"] == "Finishing" and "allowed" in cond(c.status, "Stalled")["message"]
    for name in c.worker_names():
        c.set_phase(name, "Succeeded", finished=at(12))
    c.step(at(12))
    assert c.status["state"] == "Succeeded"
    stalled = cond(c.status, "Stalled")
    assert (stalled["status"], stalled["reason"]) == ("False", "JobFinished")
    assert stalled["message"] == "the job finished (Succeeded): nothing holds or threatens it any more"
    assert st.get_condition(c.status, "Queued") is None, "a condition it never had stays absent"
    assert c.plan(at(13)).patch == {}, "written once"
    # A job failed by its deadline while the scheduler could place none of its pods: no longer Queued.
    c = FakeCluster(make_job(replicas=2).with_run_policy(activeDeadlineSeconds=60).obj())
    c.converge(at(0))
    for pod in c.pods.values():
        pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                        "message": "0/3 nodes are available: 3 Insufficient cpu."}]
    c.step(at(1))
    assert cond(c.status, "Queued")["status"] == "True"
    c.step(at(61))
    assert cond(c.status, "Failed")["reason"] == "DeadlineExceeded"
    assert (cond(c.status, "Queued")["status"], cond(c.status, "Queued")["reason"]) == ("False", "JobFinished")


def test_a_job_that_succeeds_with_an_incident_still_recovering_closes_it() -> None:
    c = running_cluster()
    c.set_phase("job-rdzv", "Failed", exit_code=137)
    c.step(at(5))
    assert c.status["incidents"][0]["outcome"] == "Recovering"
    for name in c.worker_names():  # the group trained through the store's loss and finished
        c.set_phase(name, "Succeeded")
    c.step(at(100))
    assert cond(c.status, "Succeeded")["reason"] == "WorkersSucceeded"
    [incident] = c.status["incidents"]
    assert incident["outcome"] == "Recovered" and incident["recoveredTime"] == "2026-01-01T12:01:40Z"
    assert incident["message"].endswith("(closed when the job succeeded)")


def test_elastic_success_waits_for_stragglers_then_close_timeout() -> None:
    c = FakeCluster(make_job(replicas=3).with_elastic(1, 3).obj())
    c.converge(at(0))
    c.run_all()
    c.set_phase("job-worker-0", "Succeeded", finished=at(10))
    c.set_phase("job-worker-2", "Failed", exit_code=137, finished=at(10))
    p = c.step(at(11))
    assert not st.condition_true(c.status, "Succeeded")
    assert p.create_pods == [] and c.status["restarts"] == 0  # no replacement after a success
    assert p.requeue_after == pytest.approx(59)
    p = c.step(at(71))
    assert st.condition_true(c.status, "Succeeded")
    assert "job-worker-1" in [d.name for d in p.delete_pods]


def test_stuck_terminating_pod_on_notready_node_is_counted_then_force_deleted_and_replaced() -> None:
    c = running_cluster(terminatingNodeTimeoutSeconds=300)
    c.pods["job-worker-0"]["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    c.node_ready["node-1"] = False
    p = c.step(at(100))  # a loss as soon as it is seen Terminating; the name is taken until it is gone
    assert p.delete_pods == [] and p.create_pods == [] and p.requeue_after == 0  # the next pass acts on the loss
    assert c.status["incidentCount"] == 1 and c.status["incidents"][0]["cause"] == "NodeLost"
    assert any("node-1 is NotReady" in m for _, _, m in c.events)
    p = c.step(at(100))
    assert p.delete_pods == [] and p.create_pods == [] and p.requeue_after == pytest.approx(200)
    p = c.step(at(301))
    assert [(d.name, d.force) for d in p.delete_pods if d.name == "job-worker-0"] == [("job-worker-0", True)]
    assert "job-worker-0" in [o["metadata"]["name"] for o in p.create_pods]
    assert c.status["incidentCount"] == 1


def test_rendezvous_pod_failure_is_one_incident_then_recreated() -> None:
    c = running_cluster()
    c.set_phase("job-rdzv", "Failed", exit_code=137)
    p = c.step(at(5))  # counted first
    assert p.delete_pods == [] and p.create_pods == []
    assert c.status["incidentCount"] == 1 and c.status["incidents"][0]["cause"] == "RendezvousLost"
    assert any(e.reason == "RendezvousLost" for e in p.events)
    p = c.step(at(6))
    assert [d.name for d in p.delete_pods] == ["job-rdzv"]
    assert [o["metadata"]["name"] for o in p.create_pods] == ["job-rdzv"]
    assert c.status["restarts"] == 0 and c.status["incidentCount"] == 1


def test_invalid_spec_fails_without_pods() -> None:
    job = make_job(replicas=5).with_elastic(1, 4).obj()
    p = plan(job, Observed(), at(0))
    assert p.invalid is not None
    assert p.create_pods == [] and p.ensure == []
    failed = cond(p.status, "Failed")
    assert failed["reason"] == "InvalidSpec" and "replicas (5) must lie within elastic [1, 4]" in failed["message"]
    assert st.get_condition(p.status, "Created") is None
    job["status"] = p.status
    assert plan(job, Observed(), at(1)).patch == {}  # no rewrite loop


def test_failed_pod_above_replicas_is_removed_not_counted() -> None:
    job = make_job(replicas=2).with_elastic(1, 4).obj()
    pods = views(pod_obj(job, 0), pod_obj(job, 1), pod_obj(job, 3, "Failed", exit_code=137), pod_obj(job, None))
    p = plan(job, Observed(pods=pods), at(0))
    assert [d.name for d in p.delete_pods] == ["job-worker-3"]
    assert p.status["restarts"] == 0

"""The recovery clock (policies/recovery_clock.py) and hot spares (spec.spares) in the planner: table tests of the pure
functions, then fault scenarios on the in-memory cluster."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest
from ddpjob_operator.api.formats import format_time
from ddpjob_operator.api.spec import InvalidSpec, parse_ddpjob
from ddpjob_operator.metrics import registry as metrics
from ddpjob_operator.planner.observation import PodView
from ddpjob_operator.planner.plan import plan
from ddpjob_operator.planner.policies import recovery_clock as recovery
from prometheus_client import REGISTRY

from .factories import T0, FakeCluster, at, make_job, pod_obj, running_cluster
from .test_crd import pruned, status_schema

pytestmark = pytest.mark.unit


def ms(seconds: float) -> str:
    """A millisecond RFC 3339 time, as the worker writes it."""
    value = at(seconds)
    return value.strftime("%Y-%m-%dT%H:%M:%S") + f".{value.microsecond // 1000:03d}Z"


def start(rdzv: float, loaded: float | None = None, first: float | None = None) -> dict[str, Any]:
    rec: dict[str, Any] = {"restartCount": 0, "rendezvousTime": ms(rdzv)}
    if loaded is not None:
        rec["checkpointLoadedTime"] = ms(loaded)
    if first is not None:
        rec["firstStepTime"] = ms(first)
    return {"globalStep": 10, "updateTime": format_time(at(first or rdzv)), "start": rec}


def replacement(created: float, scheduled: float | None, started: float | None) -> PodView:
    job = make_job().obj()
    raw = pod_obj(job, 1, "Running" if started is not None else "Pending", created=at(created),
                  started=at(started or 0))
    if scheduled is not None:
        raw["status"].setdefault("conditions", []).append(
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": format_time(at(scheduled))})
    return PodView.from_pod(raw)


OLD = PodView.from_pod(pod_obj(make_job().obj(), 0, created=at(-100), started=at(-99)))


def lost(since: float, reported: float) -> dict[str, Any]:
    return {"lostPeers": {"job-worker-1": {"silentSince": ms(since), "reportTime": ms(reported), "by": "w0"}}}


@pytest.mark.parametrize(("progress", "want"), [
    (lost(0.4, 5.5), {"detection": 5.5}),  # the incident began at the silence, truncated to the second
    (lost(-40, -35), {}),  # an older report: another incident's
    ({**lost(0.2, 5.1), **start(5.6, 6.0, 6.5)},
     {"detection": 5.1, "rendezvous": 5.6, "checkpointLoaded": 6.0, "firstStep": 6.5}),
    ({"lostPeers": {"x": "garbled"}}, {}),
])
def test_a_lost_nodes_detection_is_a_phase(progress: dict[str, Any], want: dict[str, float]) -> None:
    assert recovery.phases(T0, [OLD], progress) == want


@pytest.mark.parametrize(("pods", "progress", "want"), [
    ([OLD], {}, {}),  # nothing happened after the start yet
    ([OLD, replacement(1, 2, 4)], {}, {"replacementCreated": 1, "scheduled": 2, "containerStarted": 4}),
    ([OLD, replacement(1, None, None)], {}, {"replacementCreated": 1}),
    ([OLD], start(2.5, 5.25, 6.125), {"rendezvous": 2.5, "checkpointLoaded": 5.25, "firstStep": 6.125}),
    ([OLD], start(2.5, None, 6.0), {"rendezvous": 2.5, "firstStep": 6.0}),  # the script never called resumed()
    ([OLD], start(-3, -1, 0), {}),  # the group the incident hit: nothing of it is a phase
    # A new group announced (its rendezvous) over the previous group's record: its times are not this group's.
    ([OLD], start(2.5, 1, 2), {"rendezvous": 2.5}),
    ([OLD, replacement(1, 1, 3)], start(0.4, 2, 2.5),  # a spare: the group re-formed before the pod started
     {"replacementCreated": 1, "scheduled": 1, "containerStarted": 3, "rendezvous": 0.4, "checkpointLoaded": 2,
      "firstStep": 2.5}),
])
def test_phases(pods: list[PodView], progress: dict[str, Any], want: dict[str, float]) -> None:
    assert recovery.phases(T0, pods, progress) == want


RUNNING_NEW = PodView.from_pod(pod_obj(make_job().obj(), 1, created=at(1), started=at(3)))


@pytest.mark.parametrize(("running", "progress", "want"), [
    ([OLD], start(2, 3, 4), at(4)),  # a spare took over: no new pod needed
    ([OLD], start(-5, -4, -3), None),  # the clock is the old group's
    ([OLD, RUNNING_NEW], start(-5, -4, -3), None),  # a new pod alone proves nothing when the clock says old
    # Without a clock (a script without the reporter): the old rule.
    ([OLD], {}, None),
    ([OLD, RUNNING_NEW], {}, at(30)),
    ([OLD, RUNNING_NEW], {"updateTime": format_time(at(2))}, None),
    ([OLD, RUNNING_NEW], {"updateTime": format_time(at(5))}, at(5)),
])
def test_recovered_at(running: list[PodView], progress: dict[str, Any], want: Any) -> None:
    assert recovery.recovered_at(T0, running, progress, at(30)) == want


@pytest.mark.parametrize(("incidents", "want"), [
    ([], None),
    ([{"outcome": "Recovering"}], None),
    ([{"outcome": "Recovered", "recoverySeconds": 7}], 7.0),
    ([{"outcome": "Recovered", "recoverySeconds": 7, "phases": {"firstStep": 6.25}}], 6.25),
    ([{"outcome": "Recovered", "recoverySeconds": 3}, {"outcome": "Recovering"}], 3.0),
])
def test_last_recovery_seconds(incidents: list[dict[str, Any]], want: float | None) -> None:
    assert recovery.last_recovery_seconds(incidents) == want


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_deleted_worker_recovered_by_a_spare_records_the_clock_in_status_and_metrics() -> None:
    c = FakeCluster(make_job(replicas=2).with_spec(spares=1).obj())
    c.converge(T0)
    assert c.worker_names() == ["job-worker-0", "job-worker-1", "job-worker-2"]
    c.run_all()
    c.converge(at(1))
    assert c.status["ready"] == "2/2" and c.status["spares"] == "1/1" and c.status["readyReplicas"] == 2
    assert c.status["replicas"] == 2 and c.status["state"] == "Running"
    c.jobobj["status"]["progress"] = start(-50, -49, -48)
    c.user_delete("job-worker-1", at=at(10))
    c.step(at(10))
    assert c.status["incidents"][-1]["outcome"] == "Recovering"
    assert c.status["ready"] == "2/2" and c.status["spares"] == "0/1"
    # The survivor and the spare form the next group before the lost pod is even replaced.
    c.jobobj["status"]["progress"] = start(11.5, 13.25, 14.0)
    before = sample("ddpjob_recovery_phase_seconds_count", phase="firstStep")
    total_before = sample("ddpjob_recovery_seconds_count")
    p = c.step(at(15))
    inc = c.status["incidents"][-1]
    assert inc["outcome"] == "Recovered" and inc["phases"] == {"rendezvous": 1.5, "checkpointLoaded": 3.25,
                                                                "firstStep": 4.0}
    assert c.status["lastRecoverySeconds"] == 4.0
    assert p.recovered == [inc]
    assert any(e.reason == "IncidentRecovered" and "firstStep 4.0s" in e.message for e in p.events)
    metrics.observe_recovery(p.recovered[0])  # what apply.py does after the write
    assert sample("ddpjob_recovery_phase_seconds_count", phase="firstStep") == before + 1
    assert sample("ddpjob_recovery_seconds_count") == total_before + 1
    c.finish_terminations()
    p = c.step(at(16))
    assert [o["metadata"]["name"] for o in p.create_pods] == ["job-worker-1"]  # the next spare
    c.run_all(started=at(17))
    c.step(at(18))
    assert c.status["spares"] == "1/1" and c.status["incidentCount"] == 1


def test_without_a_clock_a_recovery_still_closes_by_the_old_rule() -> None:
    c = running_cluster(replicas=2)
    c.jobobj["status"]["progress"] = {"globalStep": 40, "updateTime": format_time(at(5))}
    c.user_delete("job-worker-1", at=at(10))
    c.step(at(10))
    c.finish_terminations()
    c.step(at(12))
    c.run_all(started=at(12))
    c.jobobj["status"]["progress"] = {"globalStep": 50, "updateTime": format_time(at(20))}
    c.step(at(21))
    inc = c.status["incidents"][-1]
    assert inc["outcome"] == "Recovered" and inc["recoverySeconds"] == 10
    assert "phases" not in inc  # the fake cluster stamps every creation at T0, before the incident
    assert c.status["lastRecoverySeconds"] == 10.0


def test_spares_are_fixed_size_only_and_count_pods() -> None:
    job = parse_ddpjob(make_job(replicas=3).with_spec(spares=2).obj())
    assert (job.spec.spares, job.spec.pod_count) == (2, 5)
    assert parse_ddpjob(make_job(replicas=3).obj()).spec.pod_count == 3
    with pytest.raises(InvalidSpec, match="spares needs a fixed-size job"):
        parse_ddpjob(make_job(replicas=2).with_elastic(1, 3).with_spec(spares=1).obj())


def test_a_spare_index_beyond_the_pod_count_is_scaled_down_and_spares_absent_without_them() -> None:
    c = FakeCluster(make_job(replicas=2).obj())
    c.converge(T0)
    assert c.worker_names() == ["job-worker-0", "job-worker-1"]
    c.run_all()
    c.converge(at(1))
    assert "spares" not in c.status
    extra = pod_obj(c.jobobj, 2, created=at(1) - timedelta(seconds=1))
    c.pods[extra["metadata"]["name"]] = extra
    p = c.step(at(2))
    assert [(d.name, d.reason) for d in p.delete_pods] == [("job-worker-2", "ScaledDown")]


STORE = "job-rdzv"
NEW_STORE = PodView.from_pod(pod_obj(make_job().obj(), None, created=at(2), started=at(4)))
OLD_STORE = PodView.from_pod(pod_obj(make_job().obj(), None, created=at(-100), started=at(-99)))
LATER = {"globalStep": 40, "updateTime": format_time(at(6))}


NOT_READY = PodView.from_pod({**pod_obj(make_job().obj(), None, created=at(2), started=at(4)),
                              "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}],
                                         "containerStatuses": [{"name": "rendezvous", "state": {"running": {
                                             "startedAt": format_time(at(4))}}}]}})


@pytest.mark.parametrize(("running", "stores", "progress", "want"), [
    ([OLD], [NEW_STORE], LATER, at(30)),  # trained through: over now that the new store listens
    ([OLD], [NOT_READY], LATER, None),  # started, still importing torch: not listening yet
    ([OLD], [NEW_STORE], {"globalStep": 40, "updateTime": format_time(at(3))}, None),  # no step since it is up
    ([OLD], [NEW_STORE], {}, None),  # nothing reported at all
    ([OLD], [OLD_STORE], LATER, None),  # the store that was lost (or no new one yet)
    ([OLD], [], LATER, None),
    ([OLD, RUNNING_NEW], [NEW_STORE], LATER, None),  # a worker was replaced: the group re-formed (recovered_at)
    # A spare started after the loss (it replaced one that took a lost worker's place before): rank 0's record
    # says the group is the one from before the loss, so the pods' start times do not matter.
    ([OLD, RUNNING_NEW], [NEW_STORE], {**start(-20, -19, -18), "updateTime": format_time(at(6))}, at(30)),
    ([OLD], [NEW_STORE], {**start(1), "updateTime": format_time(at(6))}, None),  # re-formed: recovered_at decides
    ([], [NEW_STORE], LATER, None),
])
def test_kept_training(running: list[PodView], stores: list[PodView], progress: dict[str, Any], want: Any) -> None:
    assert recovery.kept_training(T0, running, stores, progress, at(30)) == want


def test_over_a_lost_store_the_group_trained_through_has_the_new_store_pod_phases() -> None:
    incident = {"startTime": format_time(T0), "pods": [STORE], "outcome": "Recovering"}
    assert recovery.over(incident, STORE, [OLD], [OLD], [NEW_STORE], LATER, at(30)) == (
        at(30), {"replacementCreated": 2, "containerStarted": 4})
    assert recovery.over({**incident, "pods": ["job-worker-1"]}, STORE, [OLD], [OLD], [NEW_STORE], LATER,
                         at(30)) is None


@pytest.mark.parametrize(("pods", "want"), [
    ([STORE], True), ([STORE, "job-worker-1"], False), (["job-worker-1"], False), ([], False)])
def test_store_only(pods: list[str], want: bool) -> None:
    assert recovery.store_only({"pods": pods}, STORE) is want


def test_a_lost_store_the_group_trains_through_is_one_incident_closed_when_the_new_store_is_up() -> None:
    c = running_cluster(replicas=2)
    c.jobobj["status"]["progress"] = {**start(-50, -49, -48), "updateTime": format_time(at(5))}
    c.user_delete(STORE, at=at(10))
    c.step(at(10))
    inc = c.status["incidents"][-1]
    assert (inc["cause"], inc["pods"], inc["outcome"]) == ("RendezvousLost", [STORE], "Recovering")
    c.finish_terminations()
    p = c.step(at(11))
    assert [o["metadata"]["name"] for o in p.create_pods] == [STORE]
    c.run_all(started=at(13))
    c.step(at(13))
    assert c.status["incidents"][-1]["outcome"] == "Recovering"  # no step reported since the new store is up
    # The workers were never restarted: their steps go on, reported after the new store started.
    c.jobobj["status"]["progress"] = {**start(-50, -49, -48), "updateTime": format_time(at(14))}
    p = c.step(at(15))
    inc = c.status["incidents"][-1]
    assert inc["outcome"] == "Recovered" and inc["recoverySeconds"] == 5  # seen back (Ready) at at(15)
    assert "phases" not in inc  # the fake cluster stamps every creation at T0, before the incident
    assert c.status["lastRecoverySeconds"] == 5.0
    assert c.status["incidentCount"] == 1 and not p.delete_pods


def test_an_announced_group_that_did_no_step_yet_has_not_recovered() -> None:
    """Rank 0 announces a new group's rendezvous before its first step; the first step of the group before it,
    still in the merged record, proves nothing."""
    announced = start(5, 1, 2)  # rendezvous at 5, the previous group's checkpoint and first step at 1 and 2
    assert recovery.recovered_at(at(3), [OLD], announced, at(10)) is None
    assert recovery.recovered_at(at(3), [OLD], start(5, 6, 7), at(10)) == at(7)


def test_a_loss_found_late_ends_at_a_step_after_it_was_found_by_a_group_formed_before() -> None:
    """A worker deleted while no operator watched (a leader takeover): the new leader finds it missing at 0, after
    a hot spare's group already formed (-5). A step of that group after 0 proves the lost pod is not in it (the
    group it was in cannot step without it); a step from before proves nothing. Without the flag, only a group
    formed after 0 would end it: with a spare none ever forms, and the incident stayed open until the job ended."""
    spare_group = {**start(-5, -4, -3), "lastStepTime": ms(1)}
    assert recovery.recovered_at(T0, [OLD], spare_group, at(10), unwatched=True) is None  # within the clock margin
    later = {**spare_group, "lastStepTime": ms(6.5)}
    assert recovery.recovered_at(T0, [OLD], later, at(10), unwatched=True) == at(6.5)
    assert recovery.recovered_at(T0, [OLD], later, at(10)) is None  # a loss seen as it happened: a new group
    incident = {"startTime": format_time(T0), "pods": ["job-worker-1"], "outcome": "Recovering",
                "lostUnwatched": True}
    assert recovery.over(incident, STORE, [OLD], [OLD], [OLD_STORE], later, at(10)) == (at(6.5), {})


def test_the_operators_first_pass_flags_a_vanished_worker_and_closes_its_incident_on_the_spares_steps() -> None:
    c = running_cluster(replicas=2)
    c.jobobj["status"]["progress"] = {**start(-50, -49, -48), "lastStepTime": ms(-1)}
    c.step(at(2))
    del c.pods["job-worker-1"]  # gone while no operator ran
    c.apply(plan(c.jobobj, dataclasses.replace(c.observed(), first_pass=True), at(10)))  # a new operator's first
    inc = c.status["incidents"][-1]
    assert (inc["cause"], inc["outcome"], inc.get("lostUnwatched")) == ("PodDeleted", "Recovering", True)
    c.step(at(10))  # the pass after the count creates the pod again
    c.run_all(started=at(11))
    c.jobobj["status"]["progress"] = {**start(8, 8.5, 9), "lastStepTime": ms(9)}  # formed before it was found
    c.step(at(12))
    assert c.status["incidents"][-1]["outcome"] == "Recovering"
    c.jobobj["status"]["progress"] = {**start(8, 8.5, 9), "lastStepTime": ms(13)}
    c.step(at(14))
    assert c.status["incidents"][-1]["outcome"] == "Recovered"
    assert pruned(c.status, status_schema()) == []  # the CRD keeps lostUnwatched

"""onStall: RestartGroup (policies/stall_restart.py): table tests of the pure rules, then stall scenarios on the
in-memory cluster: in place first, the pods replaced when the group stalls again or the agents do not answer."""

from __future__ import annotations

from typing import Any

import pytest
from ddpjob_operator.api.formats import format_time
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.observation import PodView
from ddpjob_operator.planner.policies import stall_restart
from ddpjob_worker.restart_request import RESTART_ANNOTATION, Request, parse

from .factories import FakeCluster, at, make_job, pod_obj, running_cluster
from .test_crd import pruned, status_schema

pytestmark = pytest.mark.unit

IN_PLACE = {"id": 3, "cause": "Stalled", "restart": "InPlace", "outcome": "Recovering",
            "startTime": format_time(at(10)), "pods": ["job-worker-0", "job-worker-1"]}


def ms(seconds: float) -> str:
    value = at(seconds)
    return value.strftime("%Y-%m-%dT%H:%M:%S") + f".{value.microsecond // 1000:03d}Z"


def group(rdzv: float, first: float | None = None, step: int = 8) -> dict[str, Any]:
    """status.progress after rank 0 announced a group (and its first step)."""
    start: dict[str, Any] = {"restartCount": 0, "rendezvousTime": ms(rdzv)}
    if first is not None:
        start["firstStepTime"] = ms(first)
    last = first if first is not None else rdzv
    return {"globalStep": step, "updateTime": format_time(at(last)), "lastStepTime": ms(last), "start": start}


def worker(index: int, annotation: str | None = None, phase: str = "Running") -> PodView:
    raw = pod_obj(make_job().obj(), index, phase)
    if annotation is not None:
        raw["metadata"].setdefault("annotations", {})[RESTART_ANNOTATION] = annotation
    return PodView.from_pod(raw)


@pytest.mark.parametrize(("recent", "visible", "want"), [
    ([], True, "InPlace"),
    ([{"cause": "PodDeleted"}], True, "InPlace"),
    ([IN_PLACE], True, "ReplacePods"),  # stalled again right after an in-place restart
    ([{**IN_PLACE, "outcome": "Recovered"}], True, "ReplacePods"),
    ([IN_PLACE, {"cause": "WorkerFailed"}], True, "InPlace"),  # something else happened since
    ([{**IN_PLACE, "restart": "ReplacePods"}], True, "InPlace"),
    ([], False, "ReplacePods"),  # no start record: the operator could not see the group re-form
])
def test_mode(recent: list[dict[str, Any]], visible: bool, want: str) -> None:
    assert stall_restart.mode(recent, visible) == want


TEXT = Request(3, at(10).timestamp()).text()


@pytest.mark.parametrize(("incident", "workers", "want"), [
    (IN_PLACE, [worker(0), worker(1)], ["job-worker-0", "job-worker-1"]),
    (IN_PLACE, [worker(0, TEXT), worker(1, "2@1.000")], ["job-worker-1"]),  # an older request is replaced
    (IN_PLACE, [worker(0, TEXT), worker(1, phase="Pending")], []),  # only running pods get it
    (IN_PLACE, [worker(2)], []),  # not one of the incident's pods (a spare created since)
    ({**IN_PLACE, "outcome": "Recovered"}, [worker(0)], []),
    ({**IN_PLACE, "restart": "ReplacePods"}, [worker(0)], []),
    (None, [worker(0)], []),
])
def test_to_annotate(incident: dict[str, Any] | None, workers: list[PodView], want: list[str]) -> None:
    planned = stall_restart.to_annotate(incident, workers)
    assert [p.name for p, _ in planned] == want and all(text == TEXT for _, text in planned)
    assert all(parse(text) == Request(3, at(10).timestamp()) for _, text in planned)


@pytest.mark.parametrize(("incident", "progress", "now", "want"), [
    (IN_PLACE, {}, 129, False),  # within the answer time
    (IN_PLACE, {}, 130, True),  # no record at all
    (IN_PLACE, group(-50, -48), 130, True),  # the stalled group's record: no new group
    (IN_PLACE, group(40), 130, False),  # a new group formed (its first step may take long: the start-up clock)
    ({**IN_PLACE, "outcome": "Recovered"}, {}, 500, False),
    ({**IN_PLACE, "restart": "ReplacePods"}, {}, 500, False),
])
def test_unanswered(incident: dict[str, Any], progress: dict[str, Any], now: float, want: bool) -> None:
    assert stall_restart.unanswered(incident, progress, at(now)) is want


#: An in-place incident as this operator opens it: the stalled group's rendezvousTime, as rank 0 wrote it.
NAMED = {**IN_PLACE, "stalledGroup": ms(-50)}
#: Seconds the workers' clock is off the operator's (the request's time and the incident's start are the operator's).
SKEWS = [-600.0, -60.0, 0.0, 60.0, 600.0]


@pytest.mark.parametrize("skew", SKEWS, ids=[f"worker {s:+.0f}s" for s in SKEWS])
def test_an_answer_is_a_group_other_than_the_stalled_one_whatever_the_clocks(skew: float) -> None:
    """The group stalled (its record says it formed at -50, worker clock); the request went out at 10 (operator
    clock). A worker behind by minutes looked unanswered (its new group's time before the request) and had every
    pod replaced; the incident never closed either."""
    new_group = group(40 + skew)
    assert not stall_restart.unanswered(NAMED, new_group, at(130)), "a new group formed: answered"
    assert stall_restart.unanswered(NAMED, group(-50, -48), at(130)), "the stalled group itself: unanswered"
    assert stall_restart.unanswered({**NAMED, "stalledGroup": ""}, {}, at(130)), "no record then, none now"


def test_an_incident_of_an_older_operator_keeps_the_time_rule() -> None:
    assert stall_restart.unanswered(IN_PLACE, group(-50, -48), at(130))
    assert not stall_restart.unanswered(IN_PLACE, group(40), at(130))


def stalled_in_place(**policy: Any) -> FakeCluster:
    """Two workers that did step 7 at 10 s and nothing since; the stall found at 41 s and its request written."""
    c = running_cluster(replicas=2, progressDeadlineSeconds=30, **policy)
    c.jobobj["status"]["progress"] = {"globalStep": 7, "updateTime": format_time(at(10))}
    assert c.step(at(20)).requeue_after == pytest.approx(20)
    p = c.step(at(41))
    inc = c.status["incidents"][-1]
    assert (inc["cause"], inc["restart"], len(inc["pods"])) == ("Stalled", "InPlace", 2)
    restarted = [e.message for e in p.events if e.reason == "WorkerFailed"]
    assert len(restarted) == 2 and all("restarted in place (its checkpoints kept)" in m for m in restarted)
    assert not any("starts over" in m for m in restarted)
    assert p.delete_pods == [] and p.annotate_pods == []  # the request waits for the incident to be in the status
    assert p.requeue_after == 0  # ... the next pass at once: the echo of the status write plans nothing
    p = c.step(at(42))
    assert sorted(pod.name for pod, _ in p.annotate_pods) == ["job-worker-0", "job-worker-1"] and not p.delete_pods
    assert not c.step(at(43)).annotate_pods  # written once
    return c


def test_a_stall_restarts_the_group_in_place_keeping_the_pods_and_recovers_on_the_new_groups_first_step() -> None:
    c = stalled_in_place()
    uids = {n: p["metadata"]["uid"] for n, p in c.pods.items()}
    request = parse(c.pods["job-worker-0"]["metadata"]["annotations"][RESTART_ANNOTATION])
    assert request == Request(c.status["incidents"][-1]["id"], at(41).timestamp())
    assert not set(uids.values()) & set(c.status.get("countedFailures") or [])  # a real failure later still counts
    c.jobobj["status"]["progress"] = group(50)  # announced, no step yet: not over
    c.step(at(51))
    assert c.status["incidents"][-1]["outcome"] == "Recovering"
    c.jobobj["status"]["progress"] = group(50, 52)
    c.step(at(53))
    inc = c.status["incidents"][-1]
    assert inc["outcome"] == "Recovered" and inc["phases"]["firstStep"] == pytest.approx(11, abs=1)
    assert not st.condition_true(c.status, "Stalled") and c.status["incidentCount"] == 1
    assert {n: p["metadata"]["uid"] for n, p in c.pods.items()} == uids  # the same pods throughout
    assert pruned(c.status, status_schema()) == []


@pytest.mark.parametrize("skew", [-600.0, 600.0], ids=["worker behind", "worker ahead"])
def test_an_in_place_restart_answered_by_workers_with_another_clock_recovers_and_is_never_escalated(
        skew: float) -> None:
    c = stalled_in_place()
    c.jobobj["status"]["progress"] = group(50 + skew, 52 + skew)
    c.step(at(53))
    inc = c.status["incidents"][-1]
    assert inc["outcome"] == "Recovered", inc
    p = c.step(at(161))
    assert not [e for e in p.events if e.reason == "RestartInPlaceUnanswered"] and not p.delete_pods
    assert c.status["incidentCount"] == 1 and c.status["incidents"][-1]["restart"] == "InPlace"
    assert c.status["incidents"][-1]["stalledGroup"] == "", "the stalled group had no record"


def test_a_group_that_stalls_again_right_after_an_in_place_restart_gets_new_pods() -> None:
    c = stalled_in_place()
    c.jobobj["status"]["progress"] = group(50, 52)
    c.step(at(53))
    c.jobobj["status"]["progress"] = group(50, 60, step=9)  # then silent again
    p = c.step(at(91))
    inc = c.status["incidents"][-1]
    assert (inc["id"], inc["cause"], inc["restart"]) == (2, "Stalled", "ReplacePods")
    assert all("training starts over from step 0" in e.message for e in p.events if e.reason == "WorkerFailed")
    p = c.step(at(92))
    assert sorted((d.name, d.force) for d in p.delete_pods) == [("job-worker-0", False), ("job-worker-1", False)]


def test_agents_that_do_not_answer_get_their_pods_replaced_within_the_same_incident() -> None:
    c = stalled_in_place()
    assert c.step(at(100)).requeue_after == pytest.approx(61)  # the answer is due 120 s after the request
    p = c.step(at(161))
    assert [e.reason for e in p.events if e.reason == "RestartInPlaceUnanswered"] == ["RestartInPlaceUnanswered"]
    inc = c.status["incidents"][-1]
    assert inc["restart"] == "ReplacePods" and "did not re-form the group within 120s" in inc["message"]
    assert "training starts over from step 0" in p.events[-1].message
    p = c.step(at(162))
    assert sorted((d.name, d.force) for d in p.delete_pods) == [("job-worker-0", False), ("job-worker-1", False)]
    assert c.status["incidentCount"] == 1
    assert pruned(c.status, status_schema()) == []  # the API server keeps every field written (the CRD's schema)


def test_with_a_checkpoint_claim_replacing_the_pods_does_not_say_it_starts_over() -> None:
    job = make_job(replicas=2).with_run_policy(progressDeadlineSeconds=30).with_checkpoint(
        volumeClaim={"size": "1Gi"})
    c = FakeCluster(job.obj())
    c.converge(at(0))
    c.run_all()
    c.converge(at(1))
    c.jobobj["status"]["progress"] = {"globalStep": 7, "lastStepTime": "2026-01-01T12:00:10.500Z"}
    restarted = [e.message for e in c.step(at(41)).events if e.reason == "WorkerFailed"]
    assert len(restarted) == 2 and not any("starts over" in m for m in restarted), restarted
    p = c.step(at(161))
    said = [e.message for e in p.events if e.reason == "RestartInPlaceUnanswered"]
    assert len(said) == 1 and "replacing the pods" in said[0] and "starts over" not in said[0]

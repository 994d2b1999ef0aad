"""Pods their group reported silent (status.progress.lostPeers, policies/silent.py): which report is about which
pod, the loss it makes, and the planner replacing such a pod at once, away from its node, once counted."""

from __future__ import annotations

from datetime import datetime

import pytest
from ddpjob_operator.api.formats import format_time
from ddpjob_operator.planner.children import builders
from ddpjob_operator.planner.observation import PodView
from ddpjob_operator.planner.policies import silent

from .factories import T0, at, running_cluster

pytestmark = pytest.mark.unit


def report(since: float, reported: float, by: str = "job-worker-0", uid: str = "") -> dict[str, str]:
    return {**({"uid": uid} if uid else {}), "silentSince": format_time(at(since)),
            "reportTime": format_time(at(reported)), "by": by}


def test_reports_are_read_by_pod_and_malformed_ones_skipped() -> None:
    found = silent.reports({"globalStep": 3, "lostPeers": {
        "job-worker-1": report(10, 15, uid="u1"), "job-worker-2": {"silentSince": "yesterday"},
        "job-worker-3": "x", "job-worker-4": report(10, 15)}})
    assert found == {"job-worker-1": silent.Report(at(10), at(15), "job-worker-0", "u1"),
                     "job-worker-4": silent.Report(at(10), at(15), "job-worker-0", "")}
    assert silent.reports(None) == {} and silent.reports({}) == {}


def pod(started: datetime | None = T0, uid: str = "u1", **kw: object) -> PodView:
    return PodView(name="job-worker-1", uid=uid, replica_type="worker", index=1, phase=str(kw.get("phase", "Running")),
                   node_name="node-2", created_at=T0, started_at=started,
                   deletion_timestamp=kw.get("deleting"))  # type: ignore[arg-type]


@pytest.mark.parametrize(("view", "applies"), [
    (pod(), True),
    (pod(uid="u2", started=at(12)), False),  # the replacement of a pod deleted on purpose, found silent after it
    (pod(started=None), True),  # its UID says it: it was in the group
    (pod(phase="Failed"), False),  # already lost otherwise (policies/failure.py)
    (pod(deleting=at(12)), False),
])
def test_a_report_is_about_the_pod_of_its_uid(view: PodView, applies: bool) -> None:
    assert silent.applies(view, silent.Report(at(10), at(15), "job-worker-0", "u1")) is applies
    assert not silent.applies(view, silent.Report(at(10), at(15), "job-worker-0")), "no UID: left to Kubernetes"


#: Minutes the reporting worker's clock is off the API server's (and the operator's): a report's times are its.
SKEWS = [-600.0, -60.0, 0.0, 60.0, 600.0]


@pytest.mark.parametrize("skew", SKEWS, ids=[f"reporter {s:+.0f}s" for s in SKEWS])
def test_which_pod_a_report_is_about_does_not_depend_on_the_reporters_clock(skew: float) -> None:
    """worker-1 (u1, started at 0 by its node's clock) falls silent at 30 and is reported at 35, by a worker whose
    clock is ``skew`` seconds off. Its replacement (u2) starts at 40. The report is about u1 and never about u2: a
    reporter ahead force-deleted each new replacement, one behind had its report of the silent pod ignored."""
    said = silent.reports({"lostPeers": {"job-worker-1": report(30 + skew, 35 + skew, uid="u1")}})["job-worker-1"]
    assert silent.applies(pod(started=T0), said)
    assert not silent.applies(pod(uid="u2", started=at(40)), said)
    assert not silent.applies(pod(uid="u2", started=at(40 + 700)), said), "however long the replacement runs"


def test_the_loss_is_node_lost_from_the_start_of_the_silence_and_says_who_and_where() -> None:
    loss = silent.loss(pod(), silent.Report(at(10), at(15.5), "job-worker-0", "u1"), {"node-2": True})
    assert loss is not None and loss.cause == "NodeLost" and loss.at == at(10) and loss.index == 1
    assert loss.detail == ("silent to its group for 5.5 s (spec.rendezvous.peerTimeoutSeconds): job-worker-0 "
                           "removed it from the training group; its node node-2 is Ready to Kubernetes so far")
    assert silent.loss(pod(), None, {}) is None


def test_a_silent_worker_is_counted_then_replaced_at_once_away_from_its_node_and_only_once() -> None:
    c = running_cluster(replicas=2)
    c.pods["job-worker-1"]["spec"]["nodeName"] = "node-2"
    old = c.pods["job-worker-1"]["metadata"]["uid"]
    c.jobobj["status"]["progress"] = {"globalStep": 40, "updateTime": format_time(at(5)),
                                      "lostPeers": {"job-worker-1": report(9, 14, uid=old)}}
    p = c.step(at(14.2))
    assert p.delete_pods == [] and p.create_pods == [], "acted on only once the loss is counted"
    assert p.requeue_after == 0, "by the very next pass: nothing else changes that would bring it"
    inc = c.status["incidents"][0]
    assert (c.status["incidentCount"], inc["cause"], inc["pods"]) == (1, "NodeLost", ["job-worker-1"])
    assert inc["startTime"] == format_time(at(9)), "the recovery clock starts with the silence"
    p = c.step(at(14.4))
    assert [(d.name, d.uid, d.force, d.reason) for d in p.delete_pods] == [("job-worker-1", old, False, "Silent")]
    assert p.create_pods == [], "its node Ready to Kubernetes: deleted gracefully first (test_silent_delete.py)"
    c.node_ready["node-2"] = False
    p = c.step(at(14.6))
    assert [(d.name, d.uid, d.force, d.reason) for d in p.delete_pods] == [("job-worker-1", old, True, "Silent")]
    assert [o["metadata"]["name"] for o in p.create_pods] == ["job-worker-1"], "no wait for the stuck timeout"
    affinity = p.create_pods[0]["spec"]["affinity"]["nodeAffinity"]
    assert affinity["preferredDuringSchedulingIgnoredDuringExecution"] == [{"weight": builders.AVOID_WEIGHT,
        "preference": {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-2"]}]}}]
    assert any(e[1] == "WorkerFailed" and "node node-2" in e[2] for e in c.events)
    # The replacement (created after the report) is not the pod reported; the report stays in the status.
    c.pods["job-worker-1"]["metadata"]["creationTimestamp"] = format_time(at(15))
    c.run_all(started=at(16))
    c.converge(at(20))
    assert c.status["incidentCount"] == 1 and c.pods["job-worker-1"]["metadata"]["uid"] != old


def test_the_avoidance_keeps_the_templates_own_node_affinity() -> None:
    mine = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "gpu", "operator": "Exists"}]}]}}
    made = builders.avoiding_node({"spec": {"affinity": {"nodeAffinity": dict(mine)}}}, "node-2")
    node = made["spec"]["affinity"]["nodeAffinity"]
    required = "requiredDuringSchedulingIgnoredDuringExecution"
    assert node[required] == mine[required]
    assert len(node["preferredDuringSchedulingIgnoredDuringExecution"]) == 1


@pytest.mark.parametrize("recovered", [False, True], ids=["recovering", "recovered by a spare"])
def test_a_replacement_bound_to_the_lost_node_and_lost_with_it_is_the_same_incident(recovered: bool) -> None:
    """Every other node taken (one worker per node): the replacement is bound to the silent pod's node, still Ready
    to Kubernetes, never starts, and is evicted once the node is NotReady, after the window and (with a spare)
    after the incident recovered. One NodeLost incident, not two, and a recovered one stays recovered; a pod that
    ran and is lost again still opens a new one (the crash-loop guard)."""
    c = running_cluster(replicas=2)
    c.pods["job-worker-1"]["spec"]["nodeName"] = "node-2"
    uid = c.pods["job-worker-1"]["metadata"]["uid"]
    c.jobobj["status"]["progress"] = {"lostPeers": {"job-worker-1": report(9, 14, uid=uid)}}
    c.converge(at(14.2), passes=2)  # counted, then deleted gracefully (its node Ready to Kubernetes)...
    c.converge(at(15), passes=1)  # ...and forced once that did not finish in time (pods.SILENT_FORCE_AFTER_SECONDS)
    new = c.pods["job-worker-1"]
    assert new["metadata"]["uid"] != uid, "the replacement"
    new["spec"]["nodeName"], new["metadata"]["creationTimestamp"] = "node-2", format_time(at(15))
    if recovered:
        c.status["incidents"][0].update(outcome="Recovered", recoveredTime=format_time(at(16)), recoverySeconds=7)
    c.node_ready["node-2"] = False
    c.user_delete("job-worker-1", at=at(75))  # the taint manager, after NotReady and the toleration
    c.converge(at(75))
    assert c.status["incidentCount"] == 1, c.status["incidents"]
    inc = c.status["incidents"][0]
    assert inc["pods"] == ["job-worker-1"]
    assert (inc["outcome"], inc.get("recoverySeconds")) == (("Recovered", 7) if recovered else ("Recovering", None))
    c.finish_terminations()
    c.converge(at(31))
    c.run_all(started=at(40))
    c.converge(at(41))
    c.set_phase("job-worker-1", "Failed", exit_code=1, finished=at(50))
    c.converge(at(50))
    assert c.status["incidentCount"] == 2, "a pod that ran and failed again is a new incident"

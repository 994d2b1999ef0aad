"""Table tests of the failure classification and the incident rule (policies/failure.py, policies/incidents.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from ddpjob_operator.api.spec import RunPolicy
from ddpjob_operator.planner.observation import PodView
from ddpjob_operator.planner.policies import failure, incidents
from ddpjob_operator.planner.policies.failure import Loss

from .factories import at

pytestmark = pytest.mark.unit


def pod(**kw: Any) -> PodView:
    base: dict[str, Any] = {"name": "job-worker-1", "uid": "u1", "replica_type": "worker", "index": 1}
    return PodView(**{**base, **kw})


@pytest.mark.parametrize(
    ("view", "cause", "permanent", "words"),
    [
        (pod(phase="Failed", exit_code=137, reason="OOMKilled"), "OOMKilled", False, "exit code 137"),
        (pod(phase="Failed", exit_code=200, termination_message="RendezvousClosedError: closed (rank 0, exit code "
                                                                 "200)"), "WorkerFailed", False,
         "(lost the rendezvous store): RendezvousClosedError"),
        (pod(phase="Failed", exit_code=1, termination_message="ValueError: bad lr"), "WorkerFailed", True,
         "exit code 1: ValueError: bad lr"),
        (pod(phase="Failed", exit_code=None, reason="Evicted"), "PodEvicted", False, "evicted by the kubelet"),
        (pod(phase="Running", deletion_timestamp=at(0)), "PodDeleted", False, "deleted (not by the operator)"),
        (pod(phase="Running", deletion_timestamp=at(0), disruption="EvictionByEvictionAPI"), "PodEvicted", False,
         "kubectl drain"),
        (pod(phase="Running", deletion_timestamp=at(0), disruption="DeletionByTaintManager"), "NodeLost", False,
         "unreachable"),
        (pod(phase="Running", gone=True, deletion_timestamp=at(0)), "PodDeleted", False, "deleted"),
        (pod(phase="Failed", exit_code=128, reason="StartError", image="plain:1", termination_message=(
            'failed to create containerd task: exec: "python3": executable file not found in $PATH: unknown')),
         "WorkerFailed", True, "image plain:1 lacks the command's program"),
        (pod(phase="Failed", exit_code=128, reason="StartError", termination_message="failed to mount: EIO"),
         "WorkerFailed", False, "container could not start (StartError): failed to mount"),
        (pod(phase="Failed", exit_code=79, termination_message="image plain:1: /usr/local/bin/python3 (Python 3.11.2) "
             "cannot import torch"), "WorkerFailed", True, "(the image cannot run the runtime): image plain:1"),
    ],
)
def test_worker_loss_classification(view: PodView, cause: str, permanent: bool, words: str) -> None:
    loss = failure.worker_loss(view, RunPolicy(), {}, at(1))
    assert loss is not None
    assert (loss.cause, loss.permanent) == (cause, permanent)
    assert words in loss.detail


def test_frame_addresses_never_reach_a_loss_detail() -> None:
    native = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
              "[10.0.0.2]:4242\nException raised from recvBytes at ../torch/csrc/distributed/c10d/Utils.hpp:671 "
              "(most recent call first):\nframe #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 "
              "(0x7f1d2c5a1446 in /opt/venv/lib/python3.11/site-packages/torch/lib/libc10.so)")
    loss = failure.worker_loss(pod(phase="Failed", exit_code=201, termination_message=native), RunPolicy(), {}, at(1))
    assert loss is not None and "Connection closed by peer" in loss.detail
    assert "0x" not in loss.detail and "frame #" not in loss.detail


@pytest.mark.parametrize(
    ("view", "lost"),
    [
        (pod(phase="Running"), False),
        (pod(phase="Pending"), False),
        (pod(phase="Succeeded", exit_code=0), False),
    ],
)
def test_healthy_pods_are_no_loss(view: PodView, lost: bool) -> None:
    assert (failure.worker_loss(view, RunPolicy(), {}, at(1)) is not None) is lost


def test_rendezvous_loss_from_deletion_end_or_tombstone() -> None:
    rdzv = PodView(name="job-rdzv", uid="r", replica_type="rendezvous")
    assert failure.rendezvous_loss(rdzv, {}, at(1)) is None
    for view in (PodView(name="job-rdzv", uid="r", replica_type="rendezvous", deletion_timestamp=at(0)),
                 PodView(name="job-rdzv", uid="r", replica_type="rendezvous", gone=True),
                 PodView(name="job-rdzv", uid="r", replica_type="rendezvous", phase="Failed", reason="Evicted")):
        loss = failure.rendezvous_loss(view, {}, at(1))
        assert loss is not None and loss.cause == "RendezvousLost" and loss.index is None


def loss(pod_name: str, t: float, cause: str = "WorkerFailed", uid: str | None = None,
         permanent: bool = False, exit_code: int | None = None) -> Loss:
    index = None if pod_name.endswith("rdzv") else int(pod_name.rsplit("-", 1)[1])
    return Loss(pod_name, uid or f"{pod_name}@{t}", index, cause, at(t), "detail", exit_code, permanent)


def open_incident(iid: int, start: datetime, pods: list[str], cause: str = "WorkerFailed",
                  outcome: str = "Recovering") -> dict[str, Any]:
    return {"id": iid, "cause": cause, "startTime": start.strftime("%Y-%m-%dT%H:%M:%SZ"), "pods": pods,
            "outcome": outcome, "message": "m"}


@pytest.mark.parametrize(
    ("name", "prior", "losses", "count", "pods_per_incident"),
    [
        ("rendezvous loss with 4 workers is one incident",
         [], [loss("j-rdzv", 0, "RendezvousLost"), *(loss(f"j-worker-{i}", 3) for i in range(4))],
         1, [5]),
        ("agents exiting before the operator sees the store go still make one RendezvousLost incident",
         [], [loss("j-worker-0", 0), loss("j-rdzv", 1, "RendezvousLost")], 1, [2]),
        ("the same pod failing again is a new incident (a crash loop exhausts the budget)",
         [open_incident(1, at(0), ["j-worker-1"])], [loss("j-worker-1", 20)], 2, [1, 1]),
        ("a loss after the window is a new incident",
         [open_incident(1, at(0), ["j-worker-0"])], [loss("j-worker-1", 61)], 2, [1, 1]),
        ("a loss inside the window joins the recovering incident",
         [open_incident(1, at(0), ["j-worker-0"])], [loss("j-worker-1", 60)], 1, [2]),
        ("a recovered incident is not joined by a new fault",
         [open_incident(1, at(0), ["j-worker-0"], outcome="Recovered")], [loss("j-worker-1", 5)], 2, [1, 1]),
        ("...but by a consequence of its cause (an agent that lost its store exits 200)",
         [open_incident(1, at(0), ["j-rdzv"], "RendezvousLost", outcome="Recovered")],
         [loss("j-worker-0", 4, exit_code=200), loss("j-worker-1", 5, exit_code=200)], 1, [3]),
        ("a consequence after the window is a new incident",
         [open_incident(1, at(0), ["j-rdzv"], "RendezvousLost", outcome="Recovered")],
         [loss("j-worker-0", 61, exit_code=200)], 2, [1, 1]),
        ("a stall never joins: restarting the group is a decision of its own",
         [open_incident(1, at(0), ["j-worker-0"])], [loss("j-worker-1", 5, "Stalled")], 2, [1, 1]),
    ],
)
def test_incident_rule(name: str, prior: list[dict[str, Any]], losses: list[Loss], count: int,
                       pods_per_incident: list[int]) -> None:
    d = incidents.attribute(prior, len(prior), [], losses, window=60, backoff_limit=6)
    assert d.count == count, name
    assert [len(i["pods"]) for i in d.incidents] == pods_per_incident, name
    assert sorted(d.counted) == sorted(x.uid for x in losses)


def test_incident_takes_the_cause_that_explains_the_others() -> None:
    d = incidents.attribute([], 0, [], [loss("j-worker-0", 0), loss("j-rdzv", 1, "RendezvousLost")],
                            window=60, backoff_limit=6)
    assert d.incidents[0]["cause"] == "RendezvousLost"
    assert d.incidents[0]["message"].startswith("j-rdzv:")


def test_counted_losses_are_never_counted_again() -> None:
    first = incidents.attribute([], 0, [], [loss("j-worker-0", 0, uid="a")], window=60, backoff_limit=6)
    again = incidents.attribute(first.incidents, first.count, first.counted, [loss("j-worker-0", 0, uid="a")],
                                window=60, backoff_limit=6)
    assert again.count == 1 and again.new_losses == [] and again.incidents == first.incidents


@pytest.mark.parametrize(("limit", "incidents_seen", "exhausted"), [(3, 3, False), (3, 4, True), (0, 1, True)])
def test_backoff_limit_counts_incidents(limit: int, incidents_seen: int, exhausted: bool) -> None:
    losses = [loss("j-rdzv", 100.0 * i, "RendezvousLost", uid=f"r{i}") for i in range(incidents_seen)]
    d = incidents.attribute([], 0, [], losses, window=60, backoff_limit=limit)
    assert d.count == incidents_seen and d.exhausted is exhausted


def test_permanent_loss_is_reported() -> None:
    d = incidents.attribute([], 0, [], [loss("j-worker-0", 0, permanent=True)], window=60, backoff_limit=6)
    assert d.permanent is not None and d.permanent.pod == "j-worker-0"


def test_recent_incidents_are_capped_and_the_text_lists_them() -> None:
    losses = [loss("j-rdzv", 100.0 * i, "RendezvousLost", uid=f"r{i}") for i in range(12)]
    d = incidents.attribute([], 0, [], losses, window=60, backoff_limit=20)
    assert d.count == 12 and len(d.incidents) == incidents.MAX_RECENT
    text = incidents.list_text(d.incidents, d.count)
    assert text.startswith("2 older incident(s); #3 RendezvousLost") and "#12 RendezvousLost" in text


def test_recovery_closes_the_open_incident_once() -> None:
    recent, closed = incidents.mark_recovered([open_incident(1, at(0), ["a"])], at(9))
    assert closed is not None and closed["recoverySeconds"] == 9 and recent[-1]["outcome"] == "Recovered"
    again, none = incidents.mark_recovered(recent, at(20))
    assert none is None and again == recent
    assert incidents.mark_failed([open_incident(1, at(0), ["a"])])[-1]["outcome"] == "Failed"


def test_a_job_that_succeeds_closes_its_open_incident() -> None:
    """Issue 23 #12: a store the group trained through stayed Recovering on a Succeeded job."""
    prior = [open_incident(1, at(0), ["a"], outcome="Recovered"), open_incident(2, at(5), ["j-rdzv"], "RendezvousLost")]
    out = incidents.mark_succeeded(prior, at(60))
    assert [i["outcome"] for i in out] == ["Recovered", "Recovered"]
    assert out[0] == prior[0]  # a closed incident keeps its own recovery
    assert out[1]["recoveredTime"] == "2026-01-01T12:01:00Z" and "recoverySeconds" not in out[1]
    assert out[1]["message"] == "m (closed when the job succeeded)"
    assert prior[1]["outcome"] == "Recovering"  # pure


def test_a_reopened_incident_forgets_its_premature_recovery() -> None:
    prior = [{**open_incident(1, at(0), ["j-rdzv"], "RendezvousLost", outcome="Recovered"),
              "recoveredTime": "x", "recoverySeconds": 0}]
    d = incidents.attribute(prior, 1, [], [loss("j-worker-0", 3, exit_code=200)], window=60, backoff_limit=6)
    assert d.incidents[-1]["outcome"] == "Recovering"
    assert "recoveredTime" not in d.incidents[-1] and "recoverySeconds" not in d.incidents[-1]


def test_a_graceful_deletion_is_lost_when_requested_not_when_its_grace_ends() -> None:
    view = pod(phase="Running", deletion_timestamp=at(30), deletion_grace_seconds=30)
    found = failure.worker_loss(view, RunPolicy(), {}, at(1))
    assert found is not None and found.at == at(0)

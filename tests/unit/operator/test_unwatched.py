"""planner/policies/unwatched.py: the stable UID of a pod lost while no operator watched, kept counted while the pod
is still missing, and the create held until the count is written (the pass-level behaviour:
test_reconcile_incidents.py)."""

from __future__ import annotations

import pytest
from ddpjob_operator.api.spec import parse_ddpjob
from ddpjob_operator.planner.observation import PodView
from ddpjob_operator.planner.policies import unwatched

from .factories import at, make_job, pod_obj

JOB = make_job(replicas=2).obj()
PARSED = parse_ddpjob(JOB)
UID = JOB["metadata"]["uid"]


def _pods(*indices: int | None, gone: tuple[int | None, ...] = ()) -> list[PodView]:
    views = [PodView.from_pod(pod_obj(JOB, i)) for i in indices]
    return [*views, *(PodView.from_pod(pod_obj(JOB, i)).as_gone(at(0)) for i in gone)]


@pytest.mark.parametrize(("uid", "pods", "missing"), [
    (unwatched.loss_uid(UID, 1), _pods(0, None), True),
    (unwatched.loss_uid(UID, 1), _pods(0, 1, None), False),
    (unwatched.loss_uid(UID, 1), _pods(0, None, gone=(1,)), True),  # a tombstone is no pod
    (unwatched.loss_uid(UID, None), _pods(0, 1), True),
    (unwatched.loss_uid(UID, None), _pods(0, 1, None), False),
    (unwatched.loss_uid("another-job", 1), _pods(0), False),  # not this job's
    (f"vanished-{UID}-1-3", _pods(0), False),  # the older form, with the incident count: never kept
    ("pod-17", _pods(0), False),  # a real pod's UID: kept while it is seen (pass_state.begin)
])
def test_still_missing(uid: str, pods: list[PodView], missing: bool) -> None:
    assert unwatched.still_missing(uid, PARSED, pods) is missing


def test_losses_name_each_missing_pod_with_a_stable_uid() -> None:
    found = unwatched.losses(PARSED, _pods(0), [], had=2, now=at(5))
    assert [(x.pod, x.uid, x.cause, x.unwatched) for x in found] == [
        ("job-worker-1", unwatched.loss_uid(UID, 1), "PodDeleted", True),
        ("job-rdzv", unwatched.loss_uid(UID, None), "RendezvousLost", True)]
    assert [x.uid for x in unwatched.losses(PARSED, _pods(0), [], had=2, now=at(9))] == [x.uid for x in found], \
        "a repeated first pass finds the same losses"
    assert unwatched.losses(PARSED, _pods(0), _pods(None), had=1, now=at(5)) == [], "above status.replicas: a scale-up"


def test_hold_keeps_back_only_the_pods_whose_unwatched_loss_this_pass_counts() -> None:
    create = [{"metadata": {"name": n}} for n in ("job-rdzv", "job-worker-0", "job-worker-1")]
    counted = unwatched.losses(PARSED, _pods(0), [], had=2, now=at(5))
    assert [p["metadata"]["name"] for p in unwatched.hold(create, counted)] == ["job-worker-0"]
    assert unwatched.hold(create, []) == create

"""When a pass writes the status: table tests of policies/status_writes.py, and the planner's use of it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.plan import plan
from ddpjob_operator.planner.policies import status_writes

from .factories import FakeCluster, at, make_job


def status(state: str = "Created", ready: int = 0, *conds: tuple[str, str, str], **extra: Any) -> dict[str, Any]:
    conditions = [{"type": t, "status": s, "reason": r, "message": f"{ready}/4 worker(s) running"}
                  for t, s, r in (("Created", "True", "JobCreated"), *conds)]
    return {"state": state, "readyReplicas": ready, "ready": f"{ready}/4", "conditions": conditions, **extra}


STARTING = ("Running", "False", "WorkersStarting")
RUNNING = ("Running", "True", "AllWorkersRunning")


@pytest.mark.parametrize(
    ("old", "new", "routine"),
    [
        (status("Created", 0, STARTING), status("Created", 1, STARTING), True),  # a pod started: counts, message
        (status("Created", 3, STARTING), status("Running", 4, RUNNING), False),  # the state changes
        (status("Created", 0), status("Created", 0, STARTING), False),  # a condition appears
        (status("Created", 1, STARTING), status("Created", 1, ("Running", "False", "PodDeleted")), False),  # reason
        (status("Created", 1, STARTING), status("Created", 1, STARTING, restarts=1), False),  # what decisions use
        (status("Created", 1, STARTING), status("Created", 1, STARTING, countedFailures=["u1"]), False),
        (status("Created", 1, STARTING), status("Created", 1, STARTING), False),  # nothing to write at all
    ],
)
def test_routine(old: dict[str, Any], new: dict[str, Any], routine: bool) -> None:
    patch = st.status_patch(old, new)
    assert status_writes.routine(patch, old, new) is routine


@pytest.mark.parametrize(
    ("routine", "since", "now", "wait", "expected"),
    [
        (True, None, 0.5, 2.0, status_writes.Write(now=False, later=at(2.5))),  # first seen: wait from now
        (True, 0.0, 0.5, 2.0, status_writes.Write(now=False, later=at(2.0))),  # waiting since 0
        (True, 0.0, 2.0, 2.0, status_writes.Write(now=True)),  # waited long enough
        (True, 0.0, 5.0, 30.0, status_writes.Write(now=False, later=at(30.0))),  # a busy operator waits longer
        (False, 0.0, 0.1, 30.0, status_writes.Write(now=True)),  # a transition never waits
        (False, None, 0.1, 2.0, status_writes.Write(now=True)),
    ],
)
def test_decide(routine: bool, since: float | None, now: float, wait: float, expected: status_writes.Write) -> None:
    old = status("Created", 0, STARTING)
    new = status("Created", 1, STARTING) if routine else status("Running", 4, RUNNING)
    pending = None if since is None else at(since)
    assert status_writes.decide(st.status_patch(old, new), old, new, pending, at(now), wait) == expected


def test_nothing_to_write_is_neither_now_nor_later() -> None:
    old = status("Created", 1, STARTING)
    assert status_writes.decide({}, old, old, None, at(0)) == status_writes.Write(now=False)


@pytest.mark.parametrize(
    ("queued", "workers", "wait"),
    [(0, 16, 2.0), (16, 16, 2.0), (64, 16, 8.0), (500, 16, 30.0), (3, 0, 6.0)],
)
def test_interval_stretches_while_jobs_wait_for_a_pass(queued: int, workers: int, wait: float) -> None:
    assert status_writes.interval(queued, workers) == wait


def test_pods_starting_one_by_one_are_written_together_but_running_at_once() -> None:
    c = FakeCluster(make_job(replicas=2).obj())
    c.step(at(0))  # Created: written at once
    assert c.statuses_written == 1
    c.set_phase("job-worker-0", "Running", started=at(0))
    first = plan(c.jobobj, dataclasses.replace(c.observed(), routine_wait=2.0), at(0.5))
    assert first.patch == {} and first.status_held and first.requeue_after == pytest.approx(2.0)
    held = dataclasses.replace(c.observed(), routine_since=at(0.5), routine_wait=2.0)
    assert plan(c.jobobj, held, at(1.0)).patch == {}
    later = plan(c.jobobj, held, at(2.5))
    assert later.patch["readyReplicas"] == 1 and later.patch["replicas"] == 2 and not later.status_held
    c.set_phase("job-worker-1", "Running", started=at(0))
    c.set_phase("job-rdzv", "Running", started=at(0))
    running = plan(c.jobobj, dataclasses.replace(held, pods=c.observed().pods), at(1.0))
    assert running.patch["state"] == "Running" and running.patch["readyReplicas"] == 2
    assert ("Normal", "AllWorkersRunning") in [(e.type, e.reason) for e in running.events]

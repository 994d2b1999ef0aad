"""routine_progress.needs_pass (issue 46): which new versions of a DDPJob can skip a reconcile pass. A table of
old -> new bodies; only a routine report of a quiet running job (not its first) skips."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from ddpjob_operator.planner.policies import routine_progress

Obj = dict[str, Any]

REPORT = {"epoch": 0, "step": 10, "globalStep": 10, "source": "Reporter", "updateTime": "2026-12-07T00:00:10Z",
          "lastStepTime": "2026-12-07T00:00:10.000Z",
          "start": {"restartCount": 0, "rendezvousTime": "2026-12-07T00:00:00.000Z",
                    "firstStepTime": "2026-12-07T00:00:01.000Z"}}


def running(**status: Any) -> Obj:
    return {"apiVersion": "ddpjob.io/v1alpha1", "kind": "DDPJob",
            "metadata": {"name": "j", "namespace": "ns", "uid": "u", "generation": 1, "resourceVersion": "10"},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "w", "image": "i"}]}}},
            "status": {"state": "Running", "conditions": [{"type": "Running", "status": "True"}],
                       "progress": copy.deepcopy(REPORT), **status}}


def step(body: Obj) -> None:
    p = body["status"]["progress"]
    p.update(globalStep=20, step=20, loss=0.5, updateTime="2026-12-07T00:00:20Z",
             lastStepTime="2026-12-07T00:00:20.000Z", stepRate=1.0)
    body["metadata"]["resourceVersion"] = "11"


def checkpoint(body: Obj) -> None:
    step(body)
    body["status"]["progress"]["lastCheckpoint"] = {"step": 20, "time": "2026-12-07T00:00:20Z", "seconds": 1.5}


def new_group(body: Obj) -> None:
    step(body)
    body["status"]["progress"]["start"] = {"restartCount": 1, "rendezvousTime": "2026-12-07T00:00:15.000Z"}


def finished(body: Obj) -> None:
    step(body)
    body["status"]["progress"]["finishTime"] = "2026-12-07T00:00:20.000Z"


def peers_lost(body: Obj) -> None:
    step(body)
    body["status"]["progress"]["lostPeers"] = [{"rank": 1}]


def spec_edit(body: Obj) -> None:
    step(body)
    body["spec"]["replicas"] = 3


def label(body: Obj) -> None:
    step(body)
    body["metadata"]["labels"] = {"a": "b"}


def deleting(body: Obj) -> None:
    step(body)
    body["metadata"]["deletionTimestamp"] = "2026-12-07T00:00:20Z"


def operator_status(body: Obj) -> None:
    step(body)
    body["status"]["ready"] = "1/2"


def managed_fields(body: Obj) -> None:
    step(body)
    body["metadata"]["managedFields"] = [{"manager": "ddpjob-worker"}]


RECOVERING = [{"id": 1, "cause": "PodFailed", "outcome": "Recovering"}]
RECOVERED = [{"id": 1, "cause": "PodFailed", "outcome": "Recovered"}]
STALLED = [{"type": "Running", "status": "True"}, {"type": "Stalled", "status": "True"}]
NOT_STALLED = [{"type": "Running", "status": "True"}, {"type": "Stalled", "status": "False"}]


@pytest.mark.parametrize(("old", "change", "needed"), [
    (running(), step, False),  # the routine report: the stall timer reads it when due
    (running(), checkpoint, False),
    (running(), managed_fields, False),
    (running(incidents=RECOVERED), step, False),
    (running(conditions=NOT_STALLED), step, False),
    (running(), new_group, True),  # a new process group: the recovery clock and the start-up allowance
    (running(), finished, True),  # the script returned: only the workers' exit is due
    (running(), peers_lost, True),  # an agent reported peers lost: a silent rank
    (running(), spec_edit, True),
    (running(), label, True),
    (running(), deleting, True),
    (running(), operator_status, True),
    (running(incidents=RECOVERING), step, True),  # the recovery waits on this step
    (running(conditions=STALLED), step, True),  # the stall is over
    (running(state="Restarting"), step, True),
    (running(state="Created"), step, True),
    (running(progress={}), step, True),  # the first report
], ids=lambda v: v.__name__ if callable(v) else None)
def test_only_a_routine_report_of_a_quiet_running_job_skips_its_pass(old: Obj, change: Callable[[Obj], None],
                                                                      needed: bool) -> None:
    if not old["status"]["progress"]:
        old["status"].pop("progress")
    new = copy.deepcopy(old)
    new["status"].setdefault("progress", copy.deepcopy(REPORT))
    change(new)
    assert routine_progress.needs_pass(old, new) is needed


def test_routine_keys_are_what_the_reporter_sends_on_a_step() -> None:
    """The keys ProgressReporter.report sends (with its stepRate), less those that start a pass: kept in step."""
    from ddpjob_worker.progress import ProgressReporter

    sent: list[dict[str, Any]] = []

    class Api:
        def patch_namespaced_custom_object_status(self, *args: Any, body: Any = None, **kw: Any) -> None:
            sent.append(args[-1] if body is None else body)

    rep = ProgressReporter(api=Api(), total_steps=100, environ={
        "RANK": "0", "DDPJOB_NAME": "j", "DDPJOB_NAMESPACE": "ns", "DDPJOB_REPORT_PROGRESS": "1"})
    rep.report(epoch=0, step=1, global_step=1, loss=1.0, checkpoint_step=1, checkpoint_seconds=0.1, force=True)
    rep.report(epoch=0, step=2, global_step=2, loss=1.0, checkpoint_step=1, force=True)
    assert rep.drain(5)
    keys = set().union(*(p["status"]["progress"] for p in sent))
    assert keys - {"start"} == routine_progress.ROUTINE_KEYS

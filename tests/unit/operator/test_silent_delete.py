"""Issue 43 #9: a pod its group reported silent is force-deleted (grace 0, SIGKILL, no SIGTERM checkpoint) only
where its node is NotReady or has none. On a node Kubernetes calls Ready the report may be a false positive: the pod
is deleted gracefully first, and forced only once that delete has not finished within its grace period plus
pods.SILENT_FORCE_AFTER_SECONDS (a live kubelet would have removed it by then)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from ddpjob_operator.api.spec import parse_ddpjob
from ddpjob_operator.planner.observation import PodView
from ddpjob_operator.planner.policies import pods, silent

from .factories import T0, at, make_job

pytestmark = pytest.mark.unit

JOB = parse_ddpjob(make_job(replicas=2).obj())
GRACE = 90
BOUND = GRACE + pods.SILENT_FORCE_AFTER_SECONDS


def worker(index: int, *, node: str | None = "node-2", deleted_at: float | None = None) -> PodView:
    """A running worker; ``deleted_at``: a graceful delete (grace GRACE) was requested then."""
    ends = None if deleted_at is None else at(deleted_at) + timedelta(seconds=GRACE)
    return PodView(name=f"job-worker-{index}", uid=f"u{index}", replica_type="worker", index=index, phase="Running",
                   node_name=node, created_at=T0, started_at=T0, deletion_timestamp=ends,
                   deletion_grace_seconds=GRACE if ends else 0, owner_uid=JOB.uid)


def plan_with(silent_pod: PodView, node_ready: dict[str, bool], now: datetime) -> pods.PodPlan:
    return pods.plan_workers(JOB, [worker(0, node="node-1"), silent_pod], [], [silent_pod.uid],
                             node_ready={"node-1": True, **node_ready}, generation=0, incidents=1, create=True,
                             now=now, silent={silent_pod.uid})


# (case, the silent pod, node-2's readiness, now) -> (its delete: force or graceful or none, recreated now)
CASES = [
    ("Ready: graceful first", worker(1), {"node-2": True}, at(20), (False, False)),
    ("readiness unknown: graceful first", worker(1), {}, at(20), (False, False)),
    ("NotReady: force at once", worker(1), {"node-2": False}, at(20), (True, True)),
    ("no node: force at once", worker(1, node=None), {}, at(20), (True, True)),
    ("Ready, Terminating within its grace: wait", worker(1, deleted_at=20), {"node-2": True}, at(60), (None, False)),
    ("Ready, Terminating past grace, within the bound: wait", worker(1, deleted_at=20), {"node-2": True},
     at(20 + BOUND - 1), (None, False)),
    ("Ready, the graceful delete did not finish in the bound: force", worker(1, deleted_at=20), {"node-2": True},
     at(20 + BOUND), (True, True)),
    ("Terminating and its node turned NotReady: force at once", worker(1, deleted_at=20), {"node-2": False},
     at(40), (True, True)),
]


@pytest.mark.parametrize(("silent_pod", "node_ready", "now", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_a_silent_pod_is_forced_only_on_a_lost_node_or_after_a_graceful_delete_that_did_not_finish(
        silent_pod: PodView, node_ready: dict[str, bool], now: datetime, expected: tuple[bool | None, bool]) -> None:
    force, recreated = expected
    p = plan_with(silent_pod, node_ready, now)
    deletes = [(d.name, d.uid, d.force, d.reason) for d in p.delete]
    assert deletes == ([] if force is None else [("job-worker-1", "u1", force, "Silent")])
    assert [o["metadata"]["name"] for o in p.create] == (["job-worker-1"] if recreated else [])
    assert [r.index for r in p.replacements] == ([1] if recreated else [])
    if recreated and silent_pod.node_name:  # away from the node its group found silent
        term = p.create[0]["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
        assert term["preference"]["matchFields"][0]["values"] == [silent_pod.node_name]


def test_a_graceful_delete_asks_for_a_pass_when_its_bound_ends() -> None:
    pod = worker(1, deleted_at=20)
    p = plan_with(pod, {"node-2": True}, at(30))
    assert p.recheck == [at(20 + BOUND)]


def test_a_pod_being_deleted_for_its_silence_is_still_reported_silent() -> None:
    """The planner's set of silent pods keeps one once its graceful delete began (silent.applies leaves out pods
    being deleted: their loss is counted already), so the bound above applies to it."""
    report = silent.Report(at(10), at(15), "job-worker-0", uid="u1")
    live, deleting = worker(1), worker(1, deleted_at=20)
    assert pods.reported_silent([live], {"job-worker-1": report}) == pods.reported_silent(
        [deleting], {"job-worker-1": report}) != set()
    assert pods.reported_silent([deleting], {}) == set()


def test_the_controller_reads_the_node_of_a_counted_silent_pod() -> None:
    """Its readiness decides forced or graceful: the controller reads it for the pass (no wait for the stuck
    threshold), and only for pods counted and reported."""
    import asyncio

    from ddpjob_operator.runtime import controller as ctl

    from .test_controller import FakeKube

    body = make_job(replicas=2).with_status(countedFailures=["u1"], progress={"lostPeers": {"job-worker-1": {
        "uid": "u1", "silentSince": "2026-01-01T12:00:10Z", "reportTime": "2026-01-01T12:00:15Z", "by": "x"}}}).obj()
    c = ctl.Controller()
    c.kube = FakeKube(body)  # type: ignore[assignment]
    assert asyncio.run(c._node_readiness(body, [worker(0, node="node-1"), worker(1)], at(16))) == {"node-2": True}
    body["status"]["countedFailures"] = []
    assert asyncio.run(c._node_readiness(body, [worker(0, node="node-1"), worker(1)], at(16))) == {}

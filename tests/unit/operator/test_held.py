"""A held job's pods (policies/held.py): each deleted gracefully, one stuck Terminating on a NotReady node
force-deleted, so a suspended or evicted job never keeps a pod (or, under Kueue, its quota) forever."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.observation import PodView
from ddpjob_operator.planner.policies import held

from .factories import at
from .test_kueue import KueueCluster, queued


def pod(name: str, *, phase: str = "Running", deleting: float | None = None, node: str | None = "n1",
        gone: bool = False) -> PodView:
    return PodView(name=name, uid=f"u-{name}", replica_type="worker", index=0, phase=phase, node_name=node,
                   deletion_timestamp=at(deleting) if deleting is not None else None, gone=gone)


@pytest.mark.parametrize(("pods", "ready", "now", "deletes", "recheck"), [
    ([pod("a"), pod("b", phase="Failed")], {}, 0, [("a", False), ("b", True)], []),  # graceful; an ended one forced
    ([pod("a", gone=True)], {}, 0, [], []),
    ([pod("a", deleting=0)], {"n1": False}, 299, [], [at(300)]),  # Terminating: not stuck yet, look again then
    ([pod("a", deleting=0)], {"n1": False}, 300, [("a", True)], []),  # stuck on a NotReady node: forced
    ([pod("a", deleting=0)], {}, 300, [("a", True)], []),  # its node is gone: forced
    ([pod("a", deleting=0)], {"n1": True}, 1000, [], [at(300)]),  # a Ready node's kubelet finishes it
    ([pod("a", deleting=0, node=None)], {}, 1000, [], [at(300)]),  # never scheduled: its deletion is immediate
])
def test_held_pods(pods: list[PodView], ready: dict[str, bool], now: float, deletes: list[tuple[str, bool]],
                   recheck: list[datetime]) -> None:
    plan = held.plan_pods(pods, "Suspended", node_ready=ready, timeout_seconds=300, now=at(now))
    assert [(d.name, d.force) for d in plan.delete] == deletes
    assert plan.recheck == recheck


def stuck_on_a_lost_node(c: Any, node_ready: bool = False) -> None:
    """The kubelet of node-1 is gone: every graceful deletion stays Terminating."""
    c.node_ready = {"node-1": node_ready}


def test_an_evicted_job_whose_pod_is_stuck_terminating_gives_its_quota_back() -> None:
    c = KueueCluster(queued().with_run_policy(terminatingNodeTimeoutSeconds=60).obj())
    c.step(at(0))
    c.admit()
    c.step(at(1))
    c.run_all()
    c.step(at(2))
    c.evict()
    stuck_on_a_lost_node(c)
    p = c.step(at(3))  # graceful deletes: the pods stay Terminating (deletionTimestamp T0) on the lost node
    assert sorted(d.force for d in p.delete_pods) == [False] * 3 and p.workload_writes == []
    p = c.step(at(4))
    assert p.delete_pods == [] and p.workload_writes == [], "Terminating: active, the quota stays"
    assert p.requeue_after == pytest.approx(56.0), "a pass when they count as stuck"
    p = c.step(at(60))
    assert sorted((d.reason, d.force) for d in p.delete_pods) == [("NodeNotReady", True)] * 3
    p = c.step(at(61))
    assert [(w.op, w.reason) for w in p.workload_writes] == [("clear", "Preempted")], "the quota goes back"
    assert c.status["state"] == st.QUEUED and c.status["incidentCount"] == 0


def test_a_suspended_job_force_deletes_a_pod_stuck_on_a_not_ready_node() -> None:
    from .factories import running_cluster

    c = running_cluster(terminatingNodeTimeoutSeconds=60)
    c.jobobj["spec"]["runPolicy"]["suspend"] = True
    stuck_on_a_lost_node(c)
    c.step(at(10))
    assert all("deletionTimestamp" in p["metadata"] for p in c.pods.values())
    p = c.step(at(60))
    assert sorted((d.reason, d.force) for d in p.delete_pods) == [("NodeNotReady", True)] * 3
    c.step(at(61))
    assert c.pods == {} and c.status["state"] == st.SUSPENDED

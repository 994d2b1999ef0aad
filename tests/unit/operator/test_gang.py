"""Gang scheduling, pure parts: the PodGroup a gang job gets, what its pods carry, and the Queued condition."""

from __future__ import annotations

from typing import Any

import pytest
from ddpjob_operator.api import quantity
from ddpjob_operator.api.spec import POD_GROUP_LABEL, parse_ddpjob
from ddpjob_operator.planner.children import builders, gang
from ddpjob_operator.planner.observation import PodView
from ddpjob_operator.planner.policies import unschedulable

from tests.unit.operator.factories import make_job

Obj = dict[str, Any]
GI = 1024**3
MI = 1024**2


def gang_job(replicas: int = 4, resources: Obj | None = None, elastic: tuple[int, int] | None = None,
             init: Obj | None = None, **gang_fields: Any) -> Obj:
    b = make_job(replicas=replicas).with_spec(scheduling={"gang": gang_fields})
    if elastic:
        b = b.with_elastic(*elastic)
    body = b.obj()
    pod_spec = body["spec"]["template"]["spec"]
    if resources is not None:
        pod_spec["containers"][0]["resources"] = resources
    if init is not None:
        pod_spec["initContainers"] = [{"name": "init", "image": "x", "resources": init}]
    return body


def group_of(body: Obj) -> Obj:
    kids = builders.build_static_children(parse_ddpjob(body))
    groups = [k for k in kids if k["kind"] == gang.POD_GROUP_KIND]
    assert len(groups) == 1 and kids[-1] is groups[0]  # after every other child: pods come next
    return groups[0]


# rendezvous pod: requests cpu 50m, memory 64Mi (spec.RENDEZVOUS_RESOURCES); each worker's injected init
# container requests cpu 10m, memory 16Mi (inject.INIT_RESOURCES), which count where they exceed the worker's own
@pytest.mark.parametrize(("body", "members", "resources"), [
    pytest.param(gang_job(4, {"requests": {"cpu": "1", "memory": "1Gi"}}), 5,
                 {"cpu": "4050m", "memory": str(4 * GI + 64 * MI)}, id="fixed-4-workers-all-of-them"),
    pytest.param(gang_job(4, {"requests": {"cpu": "1"}}, elastic=(2, 4)), 3,
                 {"cpu": "2050m", "memory": str(64 * MI + 2 * 16 * MI)}, id="elastic-min-2-counts-2"),
    pytest.param(gang_job(2, {"limits": {"cpu": "2", "nvidia.com/gpu": "1"}}), 3,
                 {"cpu": "4050m", "memory": str(64 * MI + 2 * 16 * MI), "nvidia.com/gpu": "2"},
                 id="limits-only-are-requests"),
    pytest.param(gang_job(2, {"requests": {"cpu": "500m"}}, init={"requests": {"cpu": "3"}}), 3,
                 {"cpu": "6050m", "memory": str(64 * MI + 2 * 16 * MI)}, id="larger-init-container-wins"),
    pytest.param(gang_job(3), 4, {"cpu": "80m", "memory": str(64 * MI + 3 * 16 * MI)},
                 id="no-requests-rendezvous-and-init"),
])
def test_pod_group(body: Obj, members: int, resources: dict[str, str]) -> None:
    group = group_of(body)
    assert group["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert group["metadata"]["name"] == "job" and group["metadata"]["namespace"] == "ns"
    assert group["spec"] == {"minMember": members, "scheduleTimeoutSeconds": 60, "minResources": resources}


def test_pod_group_timeout_and_no_group_without_gang() -> None:
    assert group_of(gang_job(2, scheduleTimeoutSeconds=7))["spec"]["scheduleTimeoutSeconds"] == 7
    plain = builders.build_static_children(parse_ddpjob(make_job().obj()))
    assert all(k["kind"] != gang.POD_GROUP_KIND for k in plain)


@pytest.mark.parametrize("scheduler", ["scheduler-plugins-scheduler", "my-gang-scheduler"])
def test_every_pod_joins_the_group(scheduler: str) -> None:
    fields: dict[str, Any] = {} if scheduler == "scheduler-plugins-scheduler" else {"schedulerName": scheduler}
    job = parse_ddpjob(gang_job(3, **fields))
    for pod in [builders.build_worker_pod(job, i, generation=2) for i in range(3)] + \
               [builders.build_rendezvous_pod(job)]:
        assert pod["metadata"]["labels"][POD_GROUP_LABEL] == "job"
        assert pod["spec"]["schedulerName"] == scheduler


def test_pods_without_gang_keep_the_default_scheduler() -> None:
    job = parse_ddpjob(make_job().obj())
    for pod in (builders.build_worker_pod(job, 0), builders.build_rendezvous_pod(job)):
        assert POD_GROUP_LABEL not in pod["metadata"]["labels"]
        assert "schedulerName" not in pod["spec"]


def view(name: str, *, node: str | None = None, waiting: str = "", phase: str = "Pending",
         deleting: bool = False) -> PodView:
    from tests.unit.operator.factories import at

    return PodView(name=name, uid=name, replica_type="worker", phase=phase, node_name=node, waiting=waiting,
                   deletion_timestamp=at(0) if deleting else None)


UNSCHED = "Unschedulable: 0/3 nodes are available: 3 Insufficient cpu."
GANG_MSG = "Unschedulable: pre-filter pod w-1 cannot find enough sibling pods"


@pytest.mark.parametrize(("pods", "is_gang", "want", "reason", "in_message"), [
    pytest.param([view("w-0", waiting=UNSCHED), view("w-1", waiting=UNSCHED)], False, True, "Unschedulable",
                 "2 pod(s) unschedulable, e.g. w-0: 0/3 nodes are available", id="none-placed"),
    pytest.param([view("w-1", waiting=GANG_MSG), view("w-0")], True, True, "GangUnschedulable",
                 "e.g. w-1: pre-filter pod", id="gang-waits"),
    pytest.param([view("w-0", node="n1", phase="Running"), view("w-1", waiting=UNSCHED)], False, False,
                 "Scheduled", "placed", id="partly-placed-is-not-queued"),
    pytest.param([view("w-0"), view("w-1")], True, False, "NotQueued", "no pod", id="not-yet-looked-at"),
    pytest.param([], True, False, "NotQueued", "no pod", id="no-pods"),
    pytest.param([view("w-0", node="n1", deleting=True), view("w-1", waiting=UNSCHED)], False, True,
                 "Unschedulable", "1 pod(s)", id="a-deleting-pod-does-not-count-as-placed"),
    pytest.param([view("w-0", waiting="ContainerCreating")], False, False, "NotQueued", "no pod",
                 id="container-waiting-is-not-the-scheduler"),
])
def test_queued(pods: list[PodView], is_gang: bool, want: bool, reason: str, in_message: str) -> None:
    q = unschedulable.decide(pods, gang=is_gang)
    assert (q.queued, q.reason) == (want, reason)
    assert in_message in q.message


def test_plan_creates_the_group_and_reports_queued_then_scheduled() -> None:
    from ddpjob_operator.planner import status as st
    from ddpjob_operator.planner.plan import Observed, plan

    from tests.unit.operator.factories import at, pod_obj, views

    body = gang_job(2, {"requests": {"cpu": "1"}})
    first = plan(body, Observed(), at(0))
    assert [o["kind"] for o in first.ensure][-1] == gang.POD_GROUP_KIND
    assert {p["spec"]["schedulerName"] for p in first.create_pods} == {"scheduler-plugins-scheduler"}

    pending = [pod_obj(body, i, phase="Pending", node=None) for i in (0, 1, None)]
    for p in pending:
        p["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                      "message": "0/2 nodes are available: 2 Insufficient cpu."}]
    waiting = plan(body, Observed(pods=views(*pending)), at(1))
    cond = st.get_condition(waiting.status, st.QUEUED)
    assert cond is not None and cond["status"] == "True" and cond["reason"] == "GangUnschedulable", cond
    assert "Insufficient cpu" in cond["message"]

    body["status"] = waiting.status
    running = [pod_obj(body, i) for i in (0, 1, None)]
    placed = plan(body, Observed(pods=views(*running)), at(2))
    cond = st.get_condition(placed.status, st.QUEUED)
    assert cond is not None and cond["status"] == "False" and cond["reason"] == "Scheduled", cond


@pytest.mark.parametrize("text", ["1", "250m", "1.5Gi", "2Ki", "100M", "1e3", "0.5", "3E", "7n", "12u", "1k", 5])
def test_parse_quantity_matches_the_kubernetes_client(text: str | int) -> None:
    from decimal import Decimal

    from kubernetes.utils import parse_quantity as reference

    assert quantity.parse_quantity(text) == Decimal(reference(text))  # type: ignore[no-untyped-call]


@pytest.mark.parametrize("text", ["", "1Gb", "abc", "1.2.3"])
def test_parse_quantity_refuses_what_is_not_a_quantity(text: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        quantity.parse_quantity(text)


def test_plan_without_the_pod_group_crd_says_so() -> None:
    from ddpjob_operator.planner import status as st
    from ddpjob_operator.planner.plan import Observed, plan
    from ddpjob_operator.planner.policies.children import Problem

    from tests.unit.operator.factories import at

    refused = Problem(kind="PodGroup", name="job", conflict=False, reason="CRDNotInstalled",
                      message="the PodGroup API (scheduling.x-k8s.io/v1alpha1) is not served (fix: install ...)")
    result = plan(gang_job(2), Observed(problems={("PodGroup", "job"): refused}), at(0))
    cond = st.get_condition(result.status, st.CREATE_REFUSED)
    assert cond is not None and cond["status"] == "True" and cond["reason"] == "CRDNotInstalled", cond
    assert "PodGroup job" in cond["message"]
    assert [o["kind"] for o in result.ensure][-1] == "PodGroup"  # tried again every pass


def test_a_job_without_a_gang_builds_no_pod_for_its_children(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 46: the PodGroup's minResources come from the built pods; every pass of every job built a worker and
    the rendezvous pod for it, a PodGroup or not (4 % of the operator's CPU while 500 jobs started)."""
    from ddpjob_operator.api.spec import parse_ddpjob
    from ddpjob_operator.planner.children import builders

    def no_pod(*_: object) -> None:
        raise AssertionError("a pod built for a job without a gang")

    monkeypatch.setattr(builders, "build_worker_pod", no_pod)
    monkeypatch.setattr(builders, "build_rendezvous_pod", no_pod)
    kinds = [o["kind"] for o in builders.build_static_children(parse_ddpjob(make_job().obj()))]
    assert "PodGroup" not in kinds and "Service" in kinds

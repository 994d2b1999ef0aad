"""Issue 23 #2 on the real control plane, through tests/integration/rvproxy.py: resourceVersions the operator
cannot parse or order (the API conventions say they are opaque), and a namespaced operator whose resync lists one
namespace while a pod is created in another it listed a moment before."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Cluster, wait_for
from tests.integration.operator_support import Jobs, OperatorProcess, small_job
from tests.integration.rvproxy import OpaqueProxy, opaque, plain

RESYNC = 2


def test_the_proxy_makes_resource_versions_opaque_both_ways() -> None:
    assert opaque("12345") != "12345" and not opaque("12345").isdigit() and plain(opaque("12345")) == "12345"
    assert sorted(["9", "10"], key=lambda v: opaque(v)) != sorted(["9", "10"], key=int) or \
        sorted(["99", "100"], key=lambda v: opaque(v)) != sorted(["99", "100"], key=int)


@pytest.fixture
def proxy(cluster: Cluster, tmp_path: Path) -> Iterator[OpaqueProxy]:
    p = OpaqueProxy(cluster.kubeconfig, tmp_path)
    p.start()
    try:
        yield p
    finally:
        p.stop()


def _operator(cluster: Cluster, namespaces: list[str], proxy: OpaqueProxy, tmp_path: Path) -> OperatorProcess:
    op = OperatorProcess(cluster, namespaces, tmp_path, resync_seconds=RESYNC, kubeconfig=proxy.kubeconfig)
    op.start()
    return op


def test_an_api_server_with_opaque_resource_versions(cluster: Cluster, namespace: str, ddpjob_crd: str,
                                                     proxy: OpaqueProxy, tmp_path: Path) -> None:
    """The operator sees only opaque resourceVersions: it follows spec edits, counts each failure once, and its
    resyncs (every 2 s) take no live pod for deleted. Before, a version that is not a number read as 0: every
    watch event of the job after the first looked like the echo of its own write, and was dropped."""
    op = _operator(cluster, [namespace], proxy, tmp_path)
    jobs = Jobs(cluster, namespace)
    try:
        jobs.apply(small_job("opaque", 2, runPolicy={"backoffLimit": 5}))
        first = {p["metadata"]["uid"] for p in jobs.running("opaque", 2)}
        jobs.fail("opaque-worker-1", 137)
        wait_for(lambda: jobs.get("opaque")["status"].get("restarts") == 1, timeout=60, describe="restarts == 1",
                 state=lambda: jobs.describe("opaque"))
        jobs.running("opaque", 2)
        cluster.kubectl("patch", "ddpjob", "opaque", "-n", namespace, "--type=merge", "-p",
                        '{"spec":{"runPolicy":{"suspend":true}}}')
        jobs.wait_condition("opaque", "Suspended", timeout=30)
        wait_for(lambda: not jobs.pods("opaque"), timeout=60, describe="pods deleted on suspend")
        cluster.kubectl("patch", "ddpjob", "opaque", "-n", namespace, "--type=merge", "-p",
                        '{"spec":{"runPolicy":{"suspend":false}}}')
        pods = jobs.running("opaque", 2)
        assert not first & {p["metadata"]["uid"] for p in pods}
        time.sleep(3 * RESYNC)  # resyncs over live pods: none may be taken for deleted
        status = jobs.get("opaque")["status"]
        assert status.get("restarts") == 1 and status.get("incidentCount") == 1, status
        assert {p["metadata"]["uid"] for p in jobs.running("opaque", 2)} == {p["metadata"]["uid"] for p in pods}
        assert proxy.requests > 20 and "Traceback" not in op.tail(400), op.tail()
    finally:
        op.stop()


@pytest.fixture
def second_namespace(cluster: Cluster) -> Iterator[str]:
    name = f"t-opaque-b-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_a_pod_created_between_two_namespaces_lists_is_not_taken_for_deleted(
        cluster: Cluster, namespace: str, second_namespace: str, ddpjob_crd: str, proxy: OpaqueProxy,
        tmp_path: Path) -> None:
    """Watched namespaces a and b: a's pods are listed, then b's LIST is held 4 s; meanwhile a's worker fails and
    is replaced. The replacement is not in a's LIST, and b's LIST is newer than it: with one cut-off for all
    namespaces (the largest LIST resourceVersion) it was taken for deleted: a second incident, a live pod replaced."""
    op = _operator(cluster, [namespace, second_namespace], proxy, tmp_path)
    jobs = Jobs(cluster, namespace)
    try:
        jobs.apply(small_job("race", 1, runPolicy={"backoffLimit": 5}))
        jobs.running("race", 1)
        proxy.hold(second_namespace, 4)
        assert proxy.held.wait(timeout=5 * RESYNC), "no resync listed the second namespace"
        jobs.fail("race-worker-0", 137)
        wait_for(lambda: jobs.get("race")["status"].get("restarts") == 1, timeout=30, describe="restarts == 1")
        replacement = jobs.running("race", 1, timeout=30)[0]["metadata"]["uid"]
        proxy.release()
        time.sleep(4 + 2 * RESYNC)  # the held LIST ends, and two more resyncs run
        status = jobs.get("race")["status"]
        assert status.get("restarts") == 1 and status.get("incidentCount") == 1, status
        assert [p["metadata"]["uid"] for p in jobs.running("race", 1)] == [replacement]
    finally:
        op.stop()

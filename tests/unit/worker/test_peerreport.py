"""The report of silent peers to the operator (ddpjob_worker.peerreport): which pod a rendezvous node is, the
patch (under status.progress, the only part of the status a worker may write), and off outside a DDPJob."""

from __future__ import annotations

from typing import Any

import pytest
from ddpjob_worker import contract
from ddpjob_worker.peerreport import PeerReport, pod_of

ENV = {contract.DDPJOB_NAME: "charlm", contract.DDPJOB_NAMESPACE: "ns", contract.DDPJOB_REPORT_PROGRESS: "1",
       "HOSTNAME": "charlm-worker-0"}


class FakeApi:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def patch_namespaced_custom_object_status(self, group: str, version: str, namespace: str, plural: str,
                                              name: str, body: Any, **kwargs: Any) -> None:
        self.calls.append((group, version, namespace, plural, name, body))


@pytest.mark.parametrize(("node", "pod"), [
    ("charlm-worker-1.charlm.e2e-node-lost-rdzv-e2f3e.svc.cluster.local_1_0", "charlm-worker-1"),
    ("charlm-worker-12.charlm.ns.svc_4711_3", "charlm-worker-12"),
    ("my_job-worker-1.svc_1_0", "my_job-worker-1"),  # only the last two fields are torch's
])
def test_the_pod_of_a_rendezvous_node(node: str, pod: str) -> None:
    assert pod_of(node) == pod


def test_the_report_is_a_merge_patch_of_status_progress_lost_peers() -> None:
    api = FakeApi()
    report = PeerReport(ENV, api=api)
    patch = report.silent({"charlm-worker-1": 5.5}, now=1_800_000_000.25)
    assert report.drain(5)
    assert api.calls == [("ddpjob.io", "v1alpha1", "ns", "ddpjobs", "charlm", {"status": {"progress": patch}})]
    sent = patch["lostPeers"]["charlm-worker-1"]
    assert sent["by"] == "charlm-worker-0" and sent["reportTime"] == "2027-01-15T08:00:00.250Z"
    assert sent["silentSince"] == "2027-01-15T07:59:54.750Z"


def test_off_outside_a_ddpjob() -> None:
    api = FakeApi()
    report = PeerReport({**ENV, contract.DDPJOB_REPORT_PROGRESS: "0"}, api=api)
    assert report.silent({"charlm-worker-1": 5}) == {} and api.calls == []

"""The report of silent peers to the operator (ddpjob_worker.peerreport): which pod a rendezvous node is, the
patch (under status.progress, the only part of the status a worker may write), and off outside a DDPJob."""

from __future__ import annotations

from typing import Any

import pytest
from ddpjob_worker import contract
from ddpjob_worker.peerreport import PeerReport, node_id, pod_of, uid_of

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


UID = "0f7c2a64-5be1-4c0e-9d3a-7e2b8c1d4f60"


def test_a_node_id_carries_the_pods_uid_above_random_bits() -> None:
    ids = {node_id({contract.DDPJOB_POD_UID: UID}) for _ in range(20)}
    assert len(ids) > 1, "two incarnations in one pod would still be two participants"
    assert all(uid_of(f"w-1.svc_{i}_0") == UID for i in ids)
    outside = node_id({})  # ddpjob run: no pod
    assert 0 <= outside < 1 << 31 and uid_of(f"w-1.svc_{outside}_0") is None
    assert node_id({contract.DDPJOB_POD_UID: "not-a-uid"}) < 1 << 31
    assert uid_of("w-1.svc_1_0") is None and uid_of("garbled") is None and uid_of("a_b_c") is None


def test_the_report_is_a_merge_patch_of_status_progress_lost_peers_naming_the_pods_uid() -> None:
    api = FakeApi()
    report = PeerReport(ENV, api=api)
    node = f"charlm-worker-1.charlm.ns.svc_{node_id({contract.DDPJOB_POD_UID: UID})}_0"
    patch = report.silent({node: 5.5, "charlm-worker-2.charlm.ns.svc_4711_0": 5.5}, now=1_800_000_000.25)
    assert report.drain(5)
    assert api.calls == [("ddpjob.io", "v1alpha1", "ns", "ddpjobs", "charlm", {"status": {"progress": patch}})]
    sent = patch["lostPeers"]["charlm-worker-1"]
    assert sent["uid"] == UID and sent["by"] == "charlm-worker-0"
    assert sent["reportTime"] == "2027-01-15T08:00:00.250Z" and sent["silentSince"] == "2027-01-15T07:59:54.750Z"
    assert "uid" not in patch["lostPeers"]["charlm-worker-2"], "a node named by an older runtime: no UID"


def test_off_outside_a_ddpjob() -> None:
    api = FakeApi()
    report = PeerReport({**ENV, contract.DDPJOB_REPORT_PROGRESS: "0"}, api=api)
    assert report.silent({"charlm-worker-1": 5}) == {} and api.calls == []

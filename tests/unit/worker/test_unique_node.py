"""Each incarnation of a pod is a participant of its own in the rendezvous (compat.renew_node), against a real
c10d store in this process. torch names a node ``<fqdn>_<pid>_<local id>``; an agent that is its container's
first process has the same pid in every incarnation, so a replaced pod's old agent, stopped once its cut-off
node was back, took its replacement out of the round as it left (bench/recovery.py, 2026-11-27)."""

from __future__ import annotations

from typing import Any

from ddpjob_worker import compat, contract, peerreport

from tests.cluster.controlplane import free_port
from tests.unit.worker.test_storekeeper import handler, server


def _same_node_as(old: Any, new: Any) -> None:
    """What torch's default gives two incarnations of one pod in two containers: one descriptor."""
    new._this_node = old._this_node
    new._op_executor._node = old._this_node


def _listed(h: Any) -> set[str]:
    h._state_holder._last_sync_time = -1.0  # read the store, not the cache
    h._state_holder.sync()
    return {str(n) for n in compat.handler_state(h).participants}


def test_the_old_incarnation_leaving_took_the_new_one_out_with_torchs_names() -> None:
    port = free_port()
    _store = server(port)
    old, new = handler(port), handler(port)
    _same_node_as(old, new)
    new.next_rendezvous()
    assert _listed(new) == {str(compat.this_node(new))}
    compat.leave_round(old)  # the old pod's agent, stopped by its kubelet after the partition healed
    assert _listed(new) == set()


def test_a_renewed_node_joins_and_leaves_as_itself_and_the_old_one_cannot_remove_it() -> None:
    assert compat.capabilities().unique_node
    port = free_port()
    _store = server(port)
    old, new = handler(port), handler(port)
    _same_node_as(old, new)
    node = compat.renew_node(new, 1234567)
    assert compat.this_node(new) == node and node.pid == 1234567 and node.addr == compat.this_node(old).addr
    new.next_rendezvous()  # the join op and the world lookup must both use the renewed node
    assert _listed(new) == {str(node)}
    compat.leave_round(old)
    assert _listed(new) == {str(node)}
    compat.leave_round(new)
    assert _listed(old) == set()


def test_a_node_named_by_its_pods_uid_joins_as_itself_and_a_survivor_reads_the_uid_back() -> None:
    """Issue 43 #6: the node id carries the pod's UID (a 159-bit int in torch's ``pid`` field), through a real
    rendezvous state round trip (pickled into the store), so the report of a silent peer names that very pod."""
    uid = "0f7c2a64-5be1-4c0e-9d3a-7e2b8c1d4f60"
    port = free_port()
    _store = server(port)
    h = handler(port)
    node = compat.renew_node(h, peerreport.node_id({contract.DDPJOB_POD_UID: uid}))
    h.next_rendezvous()
    listed = _listed(h)
    assert listed == {str(node)}
    assert [peerreport.uid_of(n) for n in listed] == [uid]
    assert peerreport.pod_of(str(node)) == str(compat.this_node(h).addr).split(".", 1)[0]
    compat.leave_round(h)
    assert _listed(h) == set()

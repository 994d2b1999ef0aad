"""The store keeper against real c10d TCPStores in this process: a handler whose store went away reconnects to a
new, empty store on the same address and writes back the rendezvous state it knew (fresh heartbeats); a second
handler adopts that state; attempts are spaced; a handler it cannot drive is left to plain torchrun."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from ddpjob_worker import storekeeper
from torch._C._distributed_c10d import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousTimeout,
    _RendezvousState,
)

from tests.cluster.controlplane import free_port


def server(port: int) -> Any:
    return TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))


def handler(port: int, run_id: str = "job") -> Any:
    params = RendezvousParameters(backend="c10d", endpoint=f"127.0.0.1:{port}", run_id=run_id, min_nodes=1,
                                  max_nodes=1, is_host="false", read_timeout="5")
    backend, store = create_backend(params)
    return DynamicRendezvousHandler.from_backend(run_id, store, backend, 1, 1,
                                                 timeout=RendezvousTimeout(join=timedelta(seconds=20)))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_refreshed_copies_the_state_with_every_heartbeat_now() -> None:
    state: Any = _RendezvousState()  # keyed by node descriptions in torch; any key does here
    old = datetime(2020, 1, 1, tzinfo=UTC)
    state.last_heartbeats = {"a": old, "b": old}
    copy = storekeeper.refreshed(state)
    assert state.last_heartbeats == {"a": old, "b": old}
    assert all(datetime.now(UTC) - beat < timedelta(seconds=5) for beat in copy.last_heartbeats.values())


def test_a_handler_without_a_c10d_store_is_left_alone() -> None:
    keeper = storekeeper.StoreKeeper(object())
    keeper.lost(RuntimeError("gone"))
    assert not keeper.usable and not keeper.try_reconnect()


def test_reconnects_to_a_new_empty_store_and_restores_the_round() -> None:
    port = free_port()
    first = server(port)
    h = handler(port)
    info = h.next_rendezvous()
    round_, participants = h._state_holder.state.round, dict(h._state_holder.state.participants)
    assert info.world_size == 1 and participants
    clock, attempts = Clock(), []

    def connector(*args: Any) -> Any:
        attempts.append(args)
        return storekeeper.connect(*args)

    keeper = storekeeper.StoreKeeper(h, connector=connector, clock=clock)
    assert keeper.usable and not keeper.try_reconnect()  # nothing lost: nothing to do
    del first  # the store pod goes away
    h._state_holder._last_sync_time = -1.0  # the holder answers from a cache for a second after each sync
    with pytest.raises(RendezvousConnectionError):
        h.num_nodes_waiting()
    keeper.lost(RendezvousConnectionError("gone"))
    assert not keeper.try_reconnect() and len(attempts) == 1  # no store there yet
    clock.now += storekeeper.RETRY_SECONDS / 2
    assert not keeper.try_reconnect() and len(attempts) == 1  # spaced: no second attempt this soon
    second = server(port)  # the operator's new store pod behind the same name: empty
    clock.now += storekeeper.RETRY_SECONDS
    assert keeper.try_reconnect() and keeper.lost_since is None
    assert h.num_nodes_waiting() == 0
    state = h._state_holder.state
    assert (state.round, dict(state.participants), state.complete) == (round_, participants, True)
    raw = second.get("torch.rendezvous.job")  # what a late agent or a spare finds in the new store
    stored = pickle.loads(__import__("base64").b64decode(raw))
    assert stored.round == round_ and dict(stored.participants) == participants
    h._stop_heartbeats()


def test_the_second_agent_back_adopts_the_state_the_first_wrote() -> None:
    port = free_port()
    first = server(port)
    a, b = handler(port), handler(port)
    a.next_rendezvous()
    b._state_holder.sync()
    del first
    server_two = server(port)
    keepers = [storekeeper.StoreKeeper(h) for h in (a, b)]
    for k in keepers:
        k.lost(RuntimeError("gone"))
    b._state_holder._state = _RendezvousState()  # b knew nothing useful: it must not overwrite a's state
    assert keepers[0].try_reconnect() and keepers[1].try_reconnect()
    assert b._state_holder.state.round == a._state_holder.state.round
    assert dict(b._state_holder.state.participants) == dict(a._state_holder.state.participants)
    assert server_two.num_keys() >= 1
    a._stop_heartbeats()


def test_a_signal_during_a_reconnect_attempt_is_not_taken_for_a_store_not_back_yet() -> None:
    """torchrun's agent raises SignalException on its main thread wherever the SIGTERM finds it; an attempt takes up
    to a second (a name that does not resolve yet), and the keeper caught the exception as "not back yet": the
    pod's SIGTERM was lost and its trainers trained on until the kubelet killed them (the soak's 45 s deletions)."""
    import signal

    from torch.distributed.elastic.multiprocessing.api import SignalException

    port = free_port()
    first = server(port)
    h = handler(port)
    h.next_rendezvous()

    def connector(*args: Any) -> Any:
        raise SignalException("Process got signal: 15", signal.SIGTERM)

    clock = Clock()
    keeper = storekeeper.StoreKeeper(h, connector=connector, clock=clock)
    del first
    keeper.lost(RendezvousConnectionError("gone"))
    with pytest.raises(SignalException):
        keeper.try_reconnect()

    def sleep(seconds: float) -> None:
        clock.now += seconds

    with pytest.raises(SignalException):  # the same inside a rendezvous that waits for the store
        keeper.wait(deadline=clock.now + 60, sleep=sleep)
    h._stop_heartbeats()

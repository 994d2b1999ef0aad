"""The rendezvous store's bounds (issue 43 #11): no reply larger than MAX_REPLY_BYTES, no value grown past
MAX_VALUE_LEN by APPEND, no more than MAX_ENTRIES keys and queued items or MAX_STORED_BYTES of them. Past a bound
the offending connection is closed and nothing of its request is kept; what torchrun's rendezvous needs at
10,000 agents stays far inside each."""

from __future__ import annotations

import asyncio
import random
import struct
from collections.abc import Callable
from typing import cast

import pytest
from ddpjob_worker import storeserver, storestate
from ddpjob_worker.storeserver import MAX_REPLY_BYTES, Query, StoreServer
from ddpjob_worker.storestate import MAX_VALUE_LEN, KeyValueState, ProtocolError, StoreFull, Waiter

from tests.unit.worker.test_storeserver import HELLO, FakeWriter, blob, connect, keys, recv_exactly, request


def converse(state: KeyValueState, data: bytes) -> tuple[bytes, BaseException]:
    """Feed ``data`` and EOF to one connection of ``state``; what it replied and how the conversation ended."""

    async def run() -> tuple[bytes, BaseException]:
        reader = asyncio.StreamReader()
        reader.feed_data(HELLO + data)
        reader.feed_eof()
        writer = FakeWriter()
        conn = storeserver._Connection(state, cast(asyncio.StreamWriter, writer))
        with pytest.raises((asyncio.IncompleteReadError, ProtocolError)) as ended:
            await storeserver.converse(conn, reader)
        return bytes(writer.out), ended.value

    return asyncio.run(run())


def test_a_multi_get_that_would_build_a_huge_reply_is_refused_before_it_is_built() -> None:
    """128 Ki keys naming one 8 MiB value would be a 1 TiB reply from a 1.2 MB request; 10 of them make the point."""
    state = KeyValueState()
    state.set(b"/big", bytes(MAX_VALUE_LEN))
    count = MAX_REPLY_BYTES // MAX_VALUE_LEN + 2
    out, ended = converse(state, request(Query.MULTI_GET, keys(*[b"/big"] * count)))
    assert out == b"" and isinstance(ended, ProtocolError) and "multi_get reply larger than" in str(ended)


def test_torchruns_largest_multi_get_at_ten_thousand_agents_is_answered() -> None:
    """Its rank 0 agent reads every agent's role (~53 bytes each) in one MULTI_GET."""
    state = KeyValueState()
    names = [b"/torch.rendezvous.job.7/torchelastic/role_info/%d" % i for i in range(10_000)]
    role = b'{"role": "default", "rank": 9999, "local_world_size": 8}'
    state.set_many([(name, role) for name in names])
    out, ended = converse(state, request(Query.MULTI_GET, keys(*names)))
    assert out == blob(role) * len(names) and isinstance(ended, asyncio.IncompleteReadError)


def test_an_append_past_the_value_cap_is_refused_and_the_value_kept() -> None:
    state = KeyValueState()
    state.set(b"/log", bytes(MAX_VALUE_LEN - 4))
    state.append(b"/log", b"1234")  # up to the cap: fine
    out, ended = converse(state, request(Query.APPEND, blob(b"/log"), blob(b"5")) + request(Query.GETNUMKEYS))
    assert out == b"" and isinstance(ended, ProtocolError) and "larger than" in str(ended)
    assert len(state.data[b"/log"]) == MAX_VALUE_LEN


def test_the_store_refuses_entries_past_its_caps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storestate, "MAX_ENTRIES", 4)
    state = KeyValueState()
    for i in range(3):
        state.set(b"/k%d" % i, b"v")
    state.queue_push(b"/q", b"item")  # a queued item is an entry too
    with pytest.raises(StoreFull, match="at most 4"):
        state.set(b"/one-more", b"v")
    state.set(b"/k0", b"a new value")  # an existing key is no new entry
    with pytest.raises(StoreFull):
        state.set_many([(b"/k1", b"x"), (b"/new", b"y")])
    assert state.data[b"/k1"] == b"v" and b"/new" not in state.data, "none of a refused multi_set is stored"
    with pytest.raises(StoreFull):
        state.barrier(b"/barrier", 2, Waiter(lambda _: None))
    state.delete(b"/k2")
    state.set(b"/one-more", b"v")  # room again
    out, ended = converse(state, request(Query.ADD, blob(b"/counter"), struct.pack("<q", 1)))
    assert out == b"" and isinstance(ended, StoreFull), "the writer's connection is closed"


def test_the_store_refuses_bytes_past_its_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storestate, "MAX_STORED_BYTES", 100)
    state = KeyValueState()
    state.set(b"/k", bytes(90))
    with pytest.raises(StoreFull, match="bytes stored"):
        state.set(b"/k", bytes(99))  # key and value: 101 bytes
    with pytest.raises(StoreFull):
        state.queue_push(b"/q", bytes(10))
    state.set(b"/k", bytes(10))
    state.queue_push(b"/q", bytes(10))
    state.set_many([(b"/m", bytes(200)), (b"/m", b"small")])  # only the last value of a key is stored
    assert state.data[b"/m"] == b"small"


def test_the_bookkeeping_follows_every_operation() -> None:
    """Entries and bytes always equal what the store holds, through any mix of writes, deletes and queues."""
    state, rng = KeyValueState(), random.Random(43)
    waiter = Waiter(lambda _: None)
    def other() -> bytes:
        return b"/k%d" % rng.randrange(40)

    operations: list[Callable[[bytes], object]] = [
        lambda key: state.set(key, bytes(rng.randrange(20))),
        state.delete,
        lambda key: state.append(key, bytes(rng.randrange(5))),
        lambda key: state.add(key + b"n", rng.randrange(-5, 5)),
        lambda key: state.compare_set(key, b"", bytes(rng.randrange(3))),
        lambda key: state.queue_push(key + b"q", bytes(rng.randrange(8))),
        lambda key: state.queue_pop(key + b"q"),
        lambda key: state.set_many([(key, b"m"), (other(), b"mm"), (key, b"mmm")]),
        lambda key: state.barrier(key + b"b", 3, waiter),
    ]
    for _ in range(3000):
        rng.choice(operations)(other())
        queued = sum(len(q) for q in state.queues.values())
        assert state.entries == len(state.data) + queued
        assert state.stored_bytes == (sum(len(k) + len(v) for k, v in state.data.items())
                                      + sum(len(k) + sum(map(len, q)) for k, q in state.queues.items()))


def test_the_server_closes_only_the_offending_connection(server: StoreServer) -> None:
    big = connect(server)
    big.sendall(request(Query.SET, blob(b"/big"), blob(bytes(MAX_VALUE_LEN)))
                + request(Query.MULTI_GET, keys(*[b"/big"] * (MAX_REPLY_BYTES // MAX_VALUE_LEN + 2))))
    big.settimeout(10)
    assert big.recv(1) == b"", "the offending connection is closed, with no reply"
    other = connect(server)
    other.sendall(request(Query.GETNUMKEYS))
    assert recv_exactly(other, 8) == struct.pack("<q", 1)
    for sock in (big, other):
        sock.close()


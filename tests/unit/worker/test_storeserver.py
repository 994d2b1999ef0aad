"""The pure-Python TCPStore server without torch: the store's semantics (waits, compare-and-set, counters, queues,
barriers), the wire protocol fed from bytes, and the server's connection handling over real sockets in this
process (a client that leaves mid-wait, a port probe, a client that is not a TCPStore)."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from typing import Any, cast

import pytest
from ddpjob_worker import rdzv, storeserver
from ddpjob_worker.storeserver import MAX_KEY_LEN, Query, StoreServer
from ddpjob_worker.storestate import STOP_WAITING, KeyValueState, ProtocolError, Waiter, parse_counter

#: What a torch client sends first: VALIDATE and the magic number (literal, so a wrong constant cannot pass).
HELLO = bytes.fromhex("00cef7853c")

#: A torch 2.15 client's session with torch 2.15's own (libuv) server, recorded through a proxy: what the client
#: sent for each call, and what torch's server answered. GET, MULTI_GET and a blocking QUEUE_POP are a WAIT first.
TORCH_SESSION = [
    ("connect", "00cef7853c0df0460000", "f0460000"),
    ("set", "0102000000000000002f6b010000000000000076", ""),
    ("get", "06010000000000000002000000000000002f6b0302000000000000002f6b", "00010000000000000076"),
    ("add", "0402000000000000002f6e0700000000000000", "0700000000000000"),
    ("add again", "0402000000000000002f6ef7ffffffffffffff", "feffffffffffffff"),
    ("compare_set created", "0203000000000000002f63730000000000000000010000000000000061", "010000000000000061"),
    ("compare_set swapped", "0203000000000000002f6373010000000000000061010000000000000062", "010000000000000062"),
    ("compare_set refused", "0203000000000000002f637302000000000000007a7a010000000000000063", "010000000000000062"),
    ("compare_set missing", "0205000000000000002f676f6e65010000000000000078010000000000000079", "010000000000000078"),
    ("check", "05020000000000000002000000000000002f6b08000000000000002f6d697373696e67", "01"),
    ("wait timeout", "06010000000000000006000000000000002f6e657665720c", "01"),
    ("append", "0902000000000000002f6b010000000000000077", ""),
    ("multi_set", "0b0200000000000000" "03000000000000002f6d310100000000000000310300000000000000"
                  "2f6d3202000000000000003232", ""),
    ("multi_get", "06020000000000000003000000000000002f6d3103000000000000002f6d32"
                  "0a020000000000000003000000000000002f6d3103000000000000002f6d32",
     "0001000000000000003102000000000000003232"),
    ("num_keys", "07", "0500000000000000"),
    ("delete_key", "0803000000000000002f6d31", "0100000000000000"),
    ("delete_key missing", "0803000000000000002f6d31", "0000000000000000"),
    ("queue_push", "0e02000000000000002f7104000000000000006974656d", ""),
    ("queue_len", "1002000000000000002f71", "0100000000000000"),
    ("queue_pop", "06010000000000000002000000000000002f710f02000000000000002f71",
     "00010000000000000004000000000000006974656d"),
    ("queue_pop empty", "0f02000000000000002f71", "0000000000000000"),
    ("barrier", "1204000000000000002f6261720100000000000000", "00"),
]


def blob(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def keys(*names: bytes) -> bytes:
    return struct.pack("<Q", len(names)) + b"".join(blob(k) for k in names)


def request(query: Query, *parts: bytes) -> bytes:
    return bytes([query]) + b"".join(parts)


def waiting(state: KeyValueState) -> dict[bytes, Any]:
    """Key -> the waiters missing it: what the store keeps for pending waits."""
    return cast(dict[bytes, Any], state._waiting)


class Notes:
    """A waiter's notifications."""

    def __init__(self) -> None:
        self.got: list[bytes] = []
        self.waiter = Waiter(self.got.append)


# --- the store's semantics -------------------------------------------------------------------------------------

def test_add_keeps_a_decimal_counter_and_refuses_what_is_not_one() -> None:
    state = KeyValueState()
    assert state.add(b"n", 5) == 5 and state.add(b"n", -7) == -2 and state.get(b"n") == b"-2"
    state.set(b"s", b"abc")
    with pytest.raises(ProtocolError):
        state.add(b"s", 1)
    state.set(b"big", str(2**63 - 1).encode())
    with pytest.raises(ProtocolError):
        state.add(b"big", 1)


@pytest.mark.parametrize(("stored", "value"), [(b"12", 12), (b" +7", 7), (b"-3", -3), (b"42abc", 42)])
def test_a_counter_reads_as_std_stoll_reads_it(stored: bytes, value: int) -> None:
    assert parse_counter(stored) == value


@pytest.mark.parametrize(
    ("stored", "expected", "desired", "returned", "after"),
    [
        (None, b"", b"new", b"new", b"new"),  # missing key, empty expectation: created
        (None, b"old", b"new", b"old", None),  # missing key otherwise: torch answers the expectation, sets nothing
        (b"old", b"old", b"new", b"new", b"new"),  # swapped
        (b"cur", b"old", b"new", b"cur", b"cur"),  # not swapped: the current value comes back
    ],
)
def test_compare_set(stored: bytes | None, expected: bytes, desired: bytes, returned: bytes,
                     after: bytes | None) -> None:
    state = KeyValueState()
    if stored is not None:
        state.set(b"k", stored)
    assert state.compare_set(b"k", expected, desired) == returned
    assert state.data.get(b"k") == after


def test_a_wait_is_answered_once_every_key_exists_and_only_then() -> None:
    state, notes = KeyValueState(), Notes()
    state.set(b"a", b"1")
    assert not state.wait([b"a", b"b", b"c"], notes.waiter)
    state.set(b"b", b"2")
    assert notes.got == []
    state.compare_set(b"c", b"not-there", b"x")  # a refused compare_set creates nothing, wakes nobody
    assert notes.got == []
    state.append(b"c", b"3")
    assert notes.got == [STOP_WAITING]
    state.set(b"c", b"4")
    assert notes.got == [STOP_WAITING], "a finished wait is answered once"
    assert state.wait([b"a", b"b"], notes.waiter), "keys that exist answer at once"


def test_a_canceled_or_replaced_wait_is_forgotten() -> None:
    state, notes = KeyValueState(), Notes()
    assert not state.wait([b"a"], notes.waiter)
    state.cancel(notes.waiter)
    state.set(b"a", b"1")
    assert notes.got == [] and not waiting(state)
    assert not state.wait([b"x"], notes.waiter)
    assert not state.wait([b"y"], notes.waiter)  # a connection has one pending wait: the newer one
    state.set(b"x", b"1")
    assert notes.got == []
    state.set(b"y", b"1")
    assert notes.got == [STOP_WAITING] and not waiting(state)



def test_many_waiters_on_one_key_all_wake() -> None:
    state = KeyValueState()
    notes = [Notes() for _ in range(5)]
    for n in notes:
        assert not state.wait([b"go"], n.waiter)
    state.add(b"go", 1)
    assert all(n.got == [STOP_WAITING] for n in notes)


def test_a_queue_item_releases_one_blocked_pop_the_oldest() -> None:
    state, first, second = KeyValueState(), Notes(), Notes()
    assert state.queue_pop(b"q") == (0, None) and state.queue_len(b"q") == 0
    assert not state.wait([b"q"], first.waiter) and not state.wait([b"q"], second.waiter)
    state.queue_push(b"q", b"1")
    assert first.got == [STOP_WAITING] and second.got == []
    assert state.check([b"q"]) and state.queue_len(b"q") == 1
    state.queue_push(b"q", b"2")
    assert second.got == [STOP_WAITING]
    assert state.queue_pop(b"q") == (2, b"1") and state.queue_pop(b"q") == (1, b"2")
    assert not state.check([b"q"]) and b"q" not in state.queues


def test_a_barrier_answers_every_arrival_when_the_last_one_comes() -> None:
    state = KeyValueState()
    notes = [Notes() for _ in range(3)]
    assert not state.barrier(b"b", 3, notes[0].waiter)
    assert not state.barrier(b"b", 3, notes[1].waiter)
    assert [n.got for n in notes] == [[], [], []]
    assert state.barrier(b"b", 3, notes[2].waiter)
    assert [n.got for n in notes[:2]] == [[STOP_WAITING]] * 2 and state.get(b"b") == b"3"


# --- the wire protocol, fed from bytes -------------------------------------------------------------------------

class FakeWriter:
    """What a connection writes to, kept in ``out``."""

    def __init__(self) -> None:
        self.out = bytearray()

    def write(self, data: bytes) -> None:
        self.out += data

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str) -> Any:
        return None

    async def drain(self) -> None:
        pass


def converse(data: bytes) -> tuple[bytes, BaseException]:
    """Feed ``data`` and EOF to one connection; what it replied and how the conversation ended."""

    async def run() -> tuple[bytes, BaseException]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        writer = FakeWriter()
        conn = storeserver._Connection(KeyValueState(), cast(asyncio.StreamWriter, writer))
        with pytest.raises((asyncio.IncompleteReadError, ProtocolError)) as ended:
            await storeserver.converse(conn, reader)
        return bytes(writer.out), ended.value

    return asyncio.run(run())


def test_a_recorded_torch_session_gets_the_replies_torchs_server_gave() -> None:
    async def run() -> list[tuple[str, str]]:
        reader, writer = asyncio.StreamReader(), FakeWriter()
        conn = storeserver._Connection(KeyValueState(), cast(asyncio.StreamWriter, writer))
        task = asyncio.create_task(storeserver.converse(conn, reader))
        got = []
        for name, sent, _ in TORCH_SESSION:
            writer.out.clear()
            reader.feed_data(bytes.fromhex(sent))
            for _ in range(20):  # let the connection's task read and answer everything fed
                await asyncio.sleep(0)
            got.append((name, writer.out.hex()))
        task.cancel()
        return got

    assert asyncio.run(run()) == [(name, answered) for name, _, answered in TORCH_SESSION]


def test_requests_sent_back_to_back_are_answered_in_order() -> None:
    session = HELLO + b"".join([
        request(Query.PING, struct.pack("<I", 4242)),
        request(Query.SET, blob(b"/k"), blob(b"v")),
        request(Query.GET, blob(b"/k")),
        request(Query.ADD, blob(b"/n"), struct.pack("<q", -3)),
        request(Query.CHECK, keys(b"/k", b"/missing")),
        request(Query.WAIT, keys(b"/k")),
        request(Query.WAIT, keys(b"/later")),  # pending: no reply
        request(Query.CANCEL_WAIT),
        request(Query.MULTI_SET, struct.pack("<q", 2), blob(b"/a"), blob(b"1"), blob(b"/b"), blob(b"22")),
        request(Query.MULTI_GET, keys(b"/a", b"/b")),
        request(Query.GETNUMKEYS),
        request(Query.DELETE_KEY, blob(b"/a")),
        request(Query.QUEUE_PUSH, blob(b"/q"), blob(b"item")),
        request(Query.QUEUE_POP, blob(b"/q")),
        request(Query.QUEUE_POP, blob(b"/q")),
        request(Query.BARRIER, blob(b"/bar"), struct.pack("<q", 1)),
    ])
    out, ended = converse(session)
    assert isinstance(ended, asyncio.IncompleteReadError) and ended.partial == b""
    assert out == b"".join([
        struct.pack("<I", 4242), blob(b"v"), struct.pack("<q", -3), b"\x01", b"\x00", b"\x01",
        blob(b"1") + blob(b"22"), struct.pack("<q", 4), struct.pack("<q", 1),
        struct.pack("<q", 1) + blob(b"item"), struct.pack("<q", 0), b"\x00",
    ])


@pytest.mark.parametrize("opening", [b"", request(Query.PING, b"\0\0\0\0"), bytes([Query.VALIDATE]) + b"\0\0\0\0"])
def test_a_connection_that_does_not_open_with_the_magic_number_gets_nothing(opening: bytes) -> None:
    out, ended = converse(opening + request(Query.GETNUMKEYS))
    assert out == b"" and isinstance(ended, ProtocolError)


@pytest.mark.parametrize("bad", [
    request(Query.SET, struct.pack("<Q", MAX_KEY_LEN + 1)),  # a key longer than torch's server takes
    request(Query.CHECK, struct.pack("<Q", 10**9)),  # more keys than torch's server takes
    HELLO,  # VALIDATE only as the first request
    bytes([200]),
])
def test_a_request_torchs_server_refuses_ends_the_connection(bad: bytes) -> None:
    out, ended = converse(HELLO + request(Query.PING, b"\1\0\0\0") + bad + request(Query.GETNUMKEYS))
    assert out == b"\1\0\0\0" and isinstance(ended, ProtocolError)


def test_one_request_holds_at_most_max_request_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storeserver, "MAX_REQUEST_BYTES", 64)
    _, ended = converse(HELLO + request(Query.CHECK, keys(*[b"k%02d" % i for i in range(10)])))
    assert isinstance(ended, ProtocolError) and "larger than 64" in str(ended)


# --- the server over real sockets ------------------------------------------------------------------------------

def connect(server: StoreServer, hello: bytes = HELLO) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    sock.sendall(hello)
    return sock


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError(f"connection closed after {data!r}")
        data += chunk
    return data


def until(predicate: Any, what: str, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_wait_is_released_by_another_clients_set(server: StoreServer) -> None:
    sleeper, setter = connect(server), connect(server)
    sleeper.sendall(request(Query.WAIT, keys(b"/go")))
    until(lambda: b"/go" in waiting(server.state), "the wait to register")
    setter.sendall(request(Query.SET, blob(b"/go"), blob(b"1")) + request(Query.GETNUMKEYS))
    assert recv_exactly(setter, 8) == struct.pack("<q", 1)
    assert recv_exactly(sleeper, 1) == STOP_WAITING
    sleeper.close()
    setter.close()


def test_a_client_gone_mid_wait_leaves_nothing_behind(server: StoreServer) -> None:
    gone = connect(server)
    gone.sendall(request(Query.WAIT, keys(b"/never", b"/nor")))
    until(lambda: len(waiting(server.state)) == 2 and len(server.connections) == 1, "the wait")
    gone.close()
    until(lambda: not waiting(server.state) and not server.connections, "the waiter to go")
    other = connect(server)  # the server still serves, and the key's set writes to no dead socket
    other.sendall(request(Query.SET, blob(b"/never"), blob(b"x")) + request(Query.PING, b"\7\0\0\0"))
    assert recv_exactly(other, 4) == b"\7\0\0\0"
    other.close()


def test_a_port_probe_and_a_stranger_are_closed_and_do_not_hurt(server: StoreServer,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    socket.create_connection(("127.0.0.1", server.port), timeout=5).close()  # what readiness probes do
    stranger = connect(server, b"GET / HTTP/1.1\r\n\r\n")
    assert stranger.recv(1) == b"", "the server closes a connection that is not a TCPStore client's"
    stranger.close()
    client = connect(server)
    client.sendall(request(Query.PING, b"\3\0\0\0"))
    assert recv_exactly(client, 4) == b"\3\0\0\0"
    client.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "not a TCPStore client" in warnings[0], warnings


def test_close_ends_every_connection(server: StoreServer) -> None:
    client = connect(server)
    client.sendall(request(Query.WAIT, keys(b"/never")))
    until(lambda: waiting(server.state), "the wait")
    server.close()
    assert client.recv(1) == b""
    client.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1)


# --- the rendezvous pod's entry point --------------------------------------------------------------------------

def test_rdzv_serves_with_the_python_server_until_stopped() -> None:
    stop, ready = threading.Event(), threading.Event()
    serving = threading.Thread(target=rdzv.serve, args=("127.0.0.1", 0, stop, ready))
    serving.start()
    try:
        assert ready.wait(10)
    finally:
        stop.set()
        serving.join(10)
    assert not serving.is_alive()


def test_rdzv_refuses_an_unknown_implementation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(rdzv.DDPJOB_RDZV_IMPL, "java")
    with pytest.raises(SystemExit) as exited:
        rdzv.main(["--port", "0"])
    assert exited.value.code == 2

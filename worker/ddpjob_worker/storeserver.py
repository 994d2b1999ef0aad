"""A c10d TCPStore server in pure Python (stdlib only), so the job's rendezvous pod serves torchrun's store from a
small image without torch; torch's own TCPStore clients (2.6 to 2.15, libuv and classic) talk to it unchanged.

The protocol, from torch's sources (TCPStore.cpp: the client; TCPStoreBackend.{hpp,cpp}, TCPStoreLibUvBackend.cpp:
the classic and libuv servers, under c10d/store/ in later releases) and checked against recorded sessions:
- A request is a QueryType byte and its arguments: no framing, no ids. Integers are in native order (little-endian
  wherever torch ships); a key or value is a u64 length and the bytes; a key list is a u64 count and the keys.
- A connection opens with VALIDATE(0) + u32 0x3C85F7CE (no reply; torch's servers close a connection opened any
  other way), then PING(13) + u32 nonce (the client's pid), answered with the nonce, before ``TCPStore()`` returns.
- Then, ``->`` the reply: SET(1) key value. COMPARE_SET(2) key expected desired -> the value stored after it (a
  missing key is created only for an empty ``expected``; otherwise ``expected`` comes back). GET(3) key -> value.
  ADD(4) key i64 -> i64, stored as decimal text. CHECK(5) keys -> u8 READY(0)/NOT_READY(1). WAIT(6) keys -> u8
  STOP_WAITING(0) once all exist. GETNUMKEYS(7) -> i64. DELETE_KEY(8) key -> i64 0/1. APPEND(9) key value.
  MULTI_GET(10) keys -> values. MULTI_SET(11) count (key value)*. CANCEL_WAIT(12) -> u8 WAIT_CANCELED(1).
  QUEUE_PUSH(14) key value. QUEUE_POP(15) key -> i64 length before the pop, and the item if it was > 0.
  QUEUE_LEN(16) key -> i64. LIST_KEYS(17) -> i64 count, keys. BARRIER(18) key i64 world_size -> STOP_WAITING
  once that many arrived.
- The server never blocks on a client's behalf: GET, MULTI_GET and a blocking QUEUE_POP follow the client's own
  WAIT, whose timeout is the client's: it then sends CANCEL_WAIT and reads (a crossing STOP_WAITING and) the
  WAIT_CANCELED.
- Versions: 2.6's enum ends at PING(13); QUEUE_* (libuv clients only), LIST_KEYS and BARRIER were appended later
  and are all in 2.15. For every operation both have, 2.6 and 2.15 clients send the same bytes, and torch's own
  servers of both versions, libuv and classic, answer the same bytes. Torch's libuv server (the default) caps a
  key at 8 KiB, a value at 8 MiB, a key list at 128 Ki keys; the classic one has no caps, no queues, and drops
  the connection on a GET of a missing key where libuv answers empty. Releases before VALIDATE are not served.
"""

from __future__ import annotations

import asyncio
import enum
import socket
import struct
import threading
from collections.abc import Iterable
from typing import Any

from ddpjob_worker.logs import get_logger
from ddpjob_worker.storestate import MAX_VALUE_LEN, STOP_WAITING, KeyValueState, ProtocolError, Waiter, blob

log = get_logger("storeserver")


class Query(enum.IntEnum):
    """QueryType: the wire value is the position in torch's enum."""

    (VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY, APPEND, MULTI_GET, MULTI_SET,
     CANCEL_WAIT, PING, QUEUE_PUSH, QUEUE_POP, QUEUE_LEN, LIST_KEYS, BARRIER) = range(19)


#: What a client's VALIDATE carries (validationMagicNumber).
VALIDATION_MAGIC = 0x3C85F7CE
READY, NOT_READY = b"\x00", b"\x01"
WAIT_CANCELED = b"\x01"

# Torch's libuv server (the default server since 2.4) refuses larger items, so no working client sends them
# (MAX_VALUE_LEN, in storestate, too).
MAX_KEY_LEN = 8 * 1024
MAX_KEY_COUNT = 128 * 1024
#: Ours: all the bytes of one request, so a connection never holds more than this while a request arrives
#: (128 Ki keys of 8 KiB would otherwise be 1 GiB).
MAX_REQUEST_BYTES = 64 * 1024 * 1024
#: Ours: all the bytes of one reply. A MULTI_GET of 128 Ki keys (a 1.2 MB request) naming one 8 MiB value would
#: otherwise build a 1 TiB reply. torchrun's largest is its rank 0 agent reading every agent's role: ~60 bytes per
#: agent, 0.6 MB at 10,000.
MAX_REPLY_BYTES = 64 * 1024 * 1024
#: listen() backlog; the kernel caps it at net.core.somaxconn, the value torch's server asks for with -1.
BACKLOG = 4096

_U32, _I64, _U64 = struct.Struct("<I"), struct.Struct("<q"), struct.Struct("<Q")
class _Request:
    """One request's fields, read from the connection within MAX_REQUEST_BYTES."""

    __slots__ = ("_left", "_reader")

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader
        self._left = MAX_REQUEST_BYTES

    async def take(self, size: int) -> bytes:
        if size > self._left:
            raise ProtocolError(f"request larger than {MAX_REQUEST_BYTES} bytes")
        self._left -= size
        return await self._reader.readexactly(size)

    async def number(self, fmt: struct.Struct) -> int:
        return int(fmt.unpack(await self.take(fmt.size))[0])

    async def count(self) -> int:
        count = await self.number(_U64)
        if count > MAX_KEY_COUNT:
            raise ProtocolError(f"{count} keys in one request (at most {MAX_KEY_COUNT})")
        return count

    async def blob(self, limit: int) -> bytes:
        size = await self.number(_U64)
        if size > limit:
            raise ProtocolError(f"{size}-byte item (at most {limit})")
        return await self.take(size)

    async def key(self) -> bytes:
        return await self.blob(MAX_KEY_LEN)

    async def value(self) -> bytes:
        return await self.blob(MAX_VALUE_LEN)

    async def keys(self) -> list[bytes]:
        return [await self.key() for _ in range(await self.count())]


class _Connection:
    """A client's socket, the store it talks to, and its one waiter."""

    __slots__ = ("peer", "state", "waiter", "writer")

    def __init__(self, state: KeyValueState, writer: asyncio.StreamWriter) -> None:
        self.state = state
        self.writer = writer
        self.peer = str(writer.get_extra_info("peername"))
        self.waiter = Waiter(self.send)

    def send(self, data: bytes) -> None:
        # A whole reply in one write: the loop is single threaded, so a STOP_WAITING for this client, written
        # from another client's SET, can never land inside it.
        if not self.writer.is_closing():
            self.writer.write(data)


async def answer(query: int, c: _Connection, r: _Request) -> bytes | None:
    """The reply to one request whose query type was just read; None when there is none (yet)."""
    state = c.state
    match query:
        case Query.SET:
            state.set(await r.key(), await r.value())
        case Query.COMPARE_SET:
            key, expected, desired = await r.key(), await r.value(), await r.value()
            return blob(state.compare_set(key, expected, desired))
        case Query.GET:
            return blob(state.get(await r.key()))
        case Query.ADD:
            key = await r.key()
            return _I64.pack(state.add(key, await r.number(_I64)))
        case Query.CHECK:
            return READY if state.check(await r.keys()) else NOT_READY
        case Query.WAIT:
            return STOP_WAITING if state.wait(await r.keys(), c.waiter) else None
        case Query.GETNUMKEYS:
            return _I64.pack(len(state.data))
        case Query.DELETE_KEY:
            return _I64.pack(state.delete(await r.key()))
        case Query.APPEND:
            state.append(await r.key(), await r.value())
        case Query.MULTI_GET:
            return capped_reply((state.get(k) for k in await r.keys()), "multi_get")
        case Query.MULTI_SET:  # applied once all arrived: no waiter ever sees half of a multi_set
            state.set_many([(await r.key(), await r.value()) for _ in range(await r.count())])
        case Query.CANCEL_WAIT:
            state.cancel(c.waiter)
            return WAIT_CANCELED
        case Query.PING:
            return _U32.pack(await r.number(_U32))
        case Query.QUEUE_PUSH:
            state.queue_push(await r.key(), await r.value())
        case Query.QUEUE_POP:
            length, item = state.queue_pop(await r.key())
            return _I64.pack(length) + (b"" if item is None else blob(item))
        case Query.QUEUE_LEN:
            return _I64.pack(state.queue_len(await r.key()))
        case Query.LIST_KEYS:
            return _I64.pack(len(state.data)) + capped_reply(state.data, "list_keys")
        case Query.BARRIER:
            key = await r.key()
            return STOP_WAITING if state.barrier(key, await r.number(_I64), c.waiter) else None
        case _:  # VALIDATE is valid only as a connection's first request
            raise ProtocolError(f"unexpected query type {query}")
    return None


def capped_reply(items: Iterable[bytes], what: str) -> bytes:
    """``items`` as a reply carries them, refused (the connection closed) past MAX_REPLY_BYTES, before the
    reply is built."""
    parts, size = [], 0
    for item in items:
        size += _U64.size + len(item)
        if size > MAX_REPLY_BYTES:
            raise ProtocolError(f"{what} reply larger than {MAX_REPLY_BYTES} bytes")
        parts.append(blob(item))
    return b"".join(parts)


async def converse(conn: _Connection, reader: asyncio.StreamReader) -> None:
    """Answer one client's requests, in order, until it closes the connection."""
    first = await reader.readexactly(1)
    if first[0] != Query.VALIDATE or await _Request(reader).number(_U32) != VALIDATION_MAGIC:
        raise ProtocolError("not a TCPStore client: the first request is not VALIDATE with the magic number")
    while True:
        reply = await answer((await reader.readexactly(1))[0], conn, _Request(reader))
        if reply:
            conn.send(reply)
            # Back-pressure: a client that does not read its replies stops being read, so its replies queued
            # here stay within the transport's high-water mark.
            await conn.writer.drain()


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening socket; the wildcard hosts get a dual-stack IPv6 socket, as torch's libuv server binds "::"
    (then 0.0.0.0 where IPv6 is off), so the store is reachable in IPv6-only clusters too."""
    candidates: list[tuple[socket.AddressFamily, tuple[Any, ...]]]
    if host in ("", "0.0.0.0", "::"):
        candidates = [(socket.AF_INET6, ("::", port)), (socket.AF_INET, ("0.0.0.0", port))]
    else:
        candidates = [(info[0], info[4]) for info in
                      socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)]
    error: OSError = OSError(f"no address for {host!r}")
    for family, address in candidates:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            # A store restarted on the same port must not wait out the old connections' TIME_WAIT.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and address[0] == "::":
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(address)
            sock.listen(BACKLOG)
            sock.setblocking(False)
            return sock
        except OSError as e:
            sock.close()
            error = e
    raise error


def _keep_alive(sock: socket.socket | None) -> None:
    """A client whose node vanished sends no FIN; keepalive probes reset its connection within ~2 minutes, which
    frees its waiter and buffers (torch's servers keep such connections forever)."""
    if sock is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 6)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


class StoreServer:
    """Serves one KeyValueState on ``host:port`` from an asyncio loop in a daemon thread, until ``close()``.
    The port accepts connections as soon as the constructor returns (the kernel queues them)."""

    def __init__(self, host: str, port: int) -> None:
        self.state = KeyValueState()
        self.connections: set[_Connection] = set()
        sock = bind_listener(host, port)
        self.port: int = sock.getsockname()[1]
        self._loop = asyncio.new_event_loop()
        # Created on this thread, so bind and listen errors reach the caller instead of a dying thread.
        self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, sock=sock, backlog=BACKLOG))
        self._thread = threading.Thread(target=self._loop.run_forever, name="storeserver", daemon=True)

    def start(self) -> StoreServer:
        self._thread.start()
        return self

    def describe(self) -> str:
        """Size and clients, for the periodic log line (read across threads: two ints, a stale value is fine)."""
        return f"{len(self.state.data)} keys, {len(self.connections)} clients"

    def close(self) -> None:
        """Stop serving and close every client connection."""
        if self._loop.is_closed():
            return
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.run_until_complete(self._close_all())
        self._loop.close()

    async def _close_all(self) -> None:
        self._server.close()
        for conn in list(self.connections):
            # abort, not close: close would first flush what a client that stopped reading never takes. Its
            # handler then ends as if the client had left.
            conn.writer.transport.abort()
        handlers = asyncio.all_tasks() - {asyncio.current_task()}
        if handlers:
            await asyncio.wait(handlers, timeout=5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _keep_alive(writer.get_extra_info("socket"))
        conn = _Connection(self.state, writer)
        self.connections.add(conn)
        try:
            await converse(conn, reader)
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError) as e:
            # The client went away (or was a port probe); a wait it left pending goes with it.
            log.debug("client %s disconnected: %r", conn.peer, e)
        except ProtocolError as e:
            log.warning("closing the connection of client %s: %s", conn.peer, e)
        except Exception:
            log.exception("closing the connection of client %s after an unexpected error", conn.peer)
        finally:
            self.state.cancel(conn.waiter)
            self.connections.discard(conn)
            writer.close()

"""A c10d TCPStore client for counters only (ADD), in pure Python, whose every call gives up after its timeout.

The peer watch (ddpjob_worker.peerwatch) must never wait on a store longer than a poll or two. torch's TCPStore
client does not bound an ``add``: its reply is read without the store's timeout, so when the store's node is
powered off (no FIN, no RST) an ``add`` on an established connection waits until the kernel gives the connection
up. Seen in the e2e run of 2026-11-27: one agent's watch sat 55 s in an ``add`` to the lost store while the other
agent's watch, already on the new store, judged it silent and removed it from a healthy group. Here the socket
itself carries the timeout, so connect, send and every receive fail within it.

The name lookup is bounded too: ``getaddrinfo`` takes no timeout, and a resolver that does not answer (a loaded
cluster DNS, a lost packet: glibc waits 5 s per try and server) would hold the watch's thread as long, so the agent
would stop beating and its peers would take it for silent. ``resolve`` waits for the lookup at most the client's
timeout and then answers the name's last known addresses (a store that moved refuses there, and the lookup still
running brings the new ones for the next connect).

The bytes are torch's (documented in ddpjob_worker.storeserver): VALIDATE + magic, PING + nonce (answered with
the nonce), then ADD key i64 -> i64. torch's servers (libuv and classic, 2.6 to 2.15) and ours answer them
the same.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
from typing import Any

from ddpjob_worker.storeserver import VALIDATION_MAGIC, Query

_U32, _I64, _U64 = struct.Struct("<I"), struct.Struct("<q"), struct.Struct("<Q")
#: torch's TCPStore client puts this before every key it sends (TCPStore::keyPrefix_): the same counter, both ways.
KEY_PREFIX = "/"

Address = tuple[Any, ...]
Addresses = list[tuple[socket.AddressFamily, Address]]


class _Lookup:
    """One ``getaddrinfo`` in a daemon thread of its own, which may outlive every caller that waited for it."""

    def __init__(self, host: str, port: int) -> None:
        self.done = threading.Event()
        self.addresses: Addresses = []
        self.error: OSError | None = None
        threading.Thread(target=self._run, args=(host, port), name=f"ddpjob-resolve-{host}", daemon=True).start()

    def _run(self, host: str, port: int) -> None:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            self.addresses = [(family, address) for family, _, _, _, address in infos]
        except OSError as err:
            self.error = err
        finally:
            with _lock:
                if self.addresses:
                    _known[(host, port)] = self.addresses
                if _pending.get((host, port)) is self:
                    del _pending[(host, port)]
            self.done.set()


_lock = threading.Lock()
#: The lookup in flight per name: a resolver that hangs costs one thread per name, not one per connect.
_pending: dict[tuple[str, int], _Lookup] = {}
#: Each name's last answer.
_known: dict[tuple[str, int], Addresses] = {}


def _numeric(host: str, port: int) -> Addresses | None:
    """The address itself when ``host`` is one (no lookup: nothing to wait for)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
        return None
    return [(family, address) for family, _, _, _, address in infos]


def resolve(host: str, port: int, timeout: float) -> Addresses:
    """The addresses of ``host``, waiting for the lookup at most ``timeout`` seconds. A lookup that does not answer
    in time, or says the resolver failed (EAI_AGAIN), gives the name's last known addresses; without any, it raises
    TimeoutError (or that EAI_AGAIN). Any other failed lookup (no such name) raises its socket.gaierror."""
    numeric = _numeric(host, port)
    if numeric is not None:
        return numeric
    with _lock:
        lookup = _pending.get((host, port))
        if lookup is None:
            lookup = _pending[(host, port)] = _Lookup(host, port)
    answered = lookup.done.wait(timeout)
    error = lookup.error if answered else None
    if answered and error is None:
        return lookup.addresses
    if error is not None and not (isinstance(error, socket.gaierror) and error.errno == socket.EAI_AGAIN):
        raise error  # the name does not exist (any more): no old address stands for it
    with _lock:
        known = _known.get((host, port))
    if known is not None:
        return known
    raise error or TimeoutError(f"{host} did not resolve within {timeout:g} s")


def _connect(host: str, port: int, timeout: float) -> socket.socket:
    """A connected socket whose lookup and connect each give up within ``timeout``."""
    error: OSError = OSError(f"no address for {host}")
    for family, address in resolve(host, port, timeout):
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
            return sock
        except OSError as err:
            sock.close()
            error = err
    raise error


class CounterClient:
    """One connection to a store; ``timeout`` bounds the lookup, the connect and each call. Any failure raises
    OSError (a timeout is socket.timeout, a subclass) and leaves the client unusable: make a new one."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self._sock = _connect(host, port, timeout)
        try:
            self._sock.settimeout(timeout)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            nonce = os.getpid() & 0xFFFFFFFF
            self._sock.sendall(bytes([Query.VALIDATE]) + _U32.pack(VALIDATION_MAGIC)
                               + bytes([Query.PING]) + _U32.pack(nonce))
            answered = _U32.unpack(self._receive(_U32.size))[0]
            if answered != nonce:
                raise ConnectionError(f"the store at {host}:{port} answered PING {nonce} with {answered}: "
                                      "not a TCPStore")
        except BaseException:
            self._sock.close()
            raise

    def add(self, key: str, value: int) -> int:
        """The counter at ``key`` after adding ``value`` (0 reads it; a missing key counts from 0)."""
        name = (KEY_PREFIX + key).encode()
        self._sock.sendall(bytes([Query.ADD]) + _U64.pack(len(name)) + name + _I64.pack(value))
        return int(_I64.unpack(self._receive(_I64.size))[0])

    def close(self) -> None:
        self._sock.close()

    def _receive(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = self._sock.recv(size - len(data))
            if not chunk:
                raise ConnectionError("the store closed the connection")
            data += chunk
        return bytes(data)

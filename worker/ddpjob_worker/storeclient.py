"""A c10d TCPStore client for counters only (ADD), in pure Python, whose every call gives up after its timeout.

The peer watch (ddpjob_worker.peerwatch) must never wait on a store longer than a poll or two. torch's TCPStore
client does not bound an ``add``: its reply is read without the store's timeout, so when the store's node is
powered off (no FIN, no RST) an ``add`` on an established connection waits until the kernel gives the connection
up. Seen in the e2e run of 2026-11-27: one agent's watch sat 55 s in an ``add`` to the lost store while the other
agent's watch, already on the new store, judged it silent and removed it from a healthy group. Here the socket
itself carries the timeout, so connect, send and every receive fail within it.

The bytes are torch's (documented in ddpjob_worker.storeserver): VALIDATE + magic, PING + nonce (answered with
the nonce), then ADD key i64 -> i64. torch's servers (libuv and classic, 2.6 to 2.15) and ours answer them
the same.
"""

from __future__ import annotations

import os
import socket
import struct

from ddpjob_worker.storeserver import VALIDATION_MAGIC, Query

_U32, _I64, _U64 = struct.Struct("<I"), struct.Struct("<q"), struct.Struct("<Q")
#: torch's TCPStore client puts this before every key it sends (TCPStore::keyPrefix_): the same counter, both ways.
KEY_PREFIX = "/"


class CounterClient:
    """One connection to a store; ``timeout`` bounds the connect and each call. Any failure raises OSError (a
    timeout is socket.timeout, a subclass) and leaves the client unusable: make a new one."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self._sock = socket.create_connection((host, port), timeout)
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

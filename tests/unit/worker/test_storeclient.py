"""The peer watch's store client (ddpjob_worker.storeclient) without torch: counters on the pure-Python server,
and every call bounded by its timeout against stores that accept a connection and then say nothing (a powered-off
node's store looks like that to a client: no FIN, no RST). tests/worker/test_storeserver_clients.py runs it
against torch's own servers and a stopped server process."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest
from ddpjob_worker.storeclient import CounterClient
from ddpjob_worker.storeserver import StoreServer


def test_counters_are_shared_and_read_with_zero(server: StoreServer) -> None:
    a, b = CounterClient("127.0.0.1", server.port, 2), CounterClient("127.0.0.1", server.port, 2)
    try:
        counts = [a.add("p/0", 1), a.add("p/0", 1), b.add("p/0", 0), b.add("p/1", 0), b.add("p/0", -5)]
        assert counts == [1, 2, 2, 0, -3]
        assert server.state.data[b"/p/0"] == b"-3"  # the key as torch's client sends it
    finally:
        a.close()
        b.close()


class Mute:
    """A listener that accepts, reads whatever comes, and answers only what ``answer`` returns for the first 10
    bytes (the VALIDATE and the PING), then nothing."""

    def __init__(self, answer: bool, nonce_delta: int = 0) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.answer, self.delta = answer, nonce_delta
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with self.sock:
            conn, _ = self.sock.accept()
            self.conns.append(conn)
            hello = b""
            while len(hello) < 10 and (chunk := conn.recv(10 - len(hello))):
                hello += chunk
            if self.answer:
                conn.sendall(struct.pack("<I", struct.unpack("<I", hello[6:10])[0] + self.delta))
            try:
                while conn.recv(1024):
                    pass
            except OSError:  # close() closed it under this read: the test is over
                pass

    def close(self) -> None:
        for conn in self.conns:
            conn.close()


@pytest.fixture
def mute() -> Iterator[Mute]:
    m = Mute(answer=False)
    yield m
    m.close()


def test_a_store_that_never_answers_the_ping_fails_the_connect_within_the_timeout(mute: Mute) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        CounterClient("127.0.0.1", mute.port, 0.5)
    assert time.monotonic() - started < 1.5


def test_a_store_gone_silent_fails_an_add_within_the_timeout() -> None:
    """torch's client waits here until the kernel drops the connection (55 s in the e2e run of 2026-11-27)."""
    silent = Mute(answer=True)
    try:
        client = CounterClient("127.0.0.1", silent.port, 0.5)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            client.add("p/0", 1)
        assert time.monotonic() - started < 1.5
        client.close()
    finally:
        silent.close()


def test_a_wrong_ping_answer_is_not_a_store() -> None:
    stranger = Mute(answer=True, nonce_delta=1)
    try:
        with pytest.raises(ConnectionError, match="not a TCPStore"):
            CounterClient("127.0.0.1", stranger.port, 1)
    finally:
        stranger.close()

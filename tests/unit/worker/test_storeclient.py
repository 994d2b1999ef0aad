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
from typing import Any

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


class Resolver:
    """socket.getaddrinfo for one made-up name: 127.0.0.1 while ``hang`` is False; otherwise it hangs (a resolver
    that does not answer) until released, then fails as glibc does when its servers time out (EAI_AGAIN)."""

    def __init__(self, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.name, self.hang, self.calls = name, False, 0
        self.released = threading.Event()
        self._real = socket.getaddrinfo
        monkeypatch.setattr(socket, "getaddrinfo", self)

    def __call__(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        flags = kwargs.get("flags", args[3] if len(args) > 3 else 0)
        if host != self.name or flags & socket.AI_NUMERICHOST:
            return self._real(host, port, *args, **kwargs)
        self.calls += 1
        if self.hang:
            self.released.wait(10)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return self._real("127.0.0.1", port, *args, **kwargs)


@pytest.fixture
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Resolver]:
    r = Resolver(f"{request.node.name.replace('_', '-')[:50]}.store.test", monkeypatch)  # a name per test: no
    yield r  # address known from another
    r.released.set()


def test_a_resolver_that_does_not_answer_fails_the_connect_within_the_timeout(resolver: Resolver,
                                                                              server: StoreServer) -> None:
    """getaddrinfo takes no timeout: a watch that waited for it would stop beating and be taken for silent."""
    resolver.hang = True
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="did not resolve"):
        CounterClient(resolver.name, server.port, 0.5)
    assert time.monotonic() - started < 2


def test_a_reconnect_while_the_resolver_hangs_reaches_the_store_at_its_last_address(resolver: Resolver,
                                                                                   server: StoreServer) -> None:
    """The agent keeps beating: the store's name resolved before, so a reconnect does not wait for the resolver."""
    first = CounterClient(resolver.name, server.port, 2)
    assert first.add("p/0", 1) == 1
    first.close()
    resolver.hang = True
    started = time.monotonic()
    again = [CounterClient(resolver.name, server.port, 0.5) for _ in range(3)]
    assert [c.add("p/0", 1) for c in again] == [2, 3, 4]
    assert time.monotonic() - started < 4  # each connect waits 0.5 s for the lookup, then takes the old address
    for c in again:
        c.close()
    assert resolver.calls == 2, "a hung lookup is shared: one thread per name, not one per connect"


def test_a_name_that_resolves_again_is_looked_up_again(resolver: Resolver, server: StoreServer) -> None:
    """Only a lookup that does not answer falls back: an answer is always taken (the store's pod may have moved)."""
    for _ in range(2):
        CounterClient(resolver.name, server.port, 2).close()
    assert resolver.calls == 2

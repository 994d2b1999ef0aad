"""Pure parts of the local cluster helper that CI once failed on: a cluster directory whose containerd socket is too
long (containerd exits halfway up on a ttrpc socket path over 104 bytes), and two processes given one port."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import controlplane
from tests.cluster.controlplane import StartError
from tests.cluster.node import NodeState, _check_socket_paths


@pytest.mark.parametrize(("directory", "nodes", "ok"), [
    ("/tmp/pytest-of-root/pytest-3/cluster0", 4, True),
    # 99 bytes of containerd socket: 105 with ".ttrpc", the path that failed in CI.
    ("/tmp/pytest-of-root/pytest-101/test_up_down_leaves_nothing0/cluster", 1, False),
    ("/tmp/pytest-of-root/pytest-99/test_up_down_leaves_nothing0/cluster", 3, True),  # passed CI before
    # Node K's socket is one level up, so node 0's is the longest.
    ("/tmp/pytest-of-root/pytest-101/test_up_down_leaves_nothing0/cluster", 3, False),
])
def test_socket_path_limits(directory: str, nodes: int, ok: bool) -> None:
    ns = NodeState(dir=directory, nodes=nodes)
    if ok:
        _check_socket_paths(ns)
    else:
        with pytest.raises(StartError, match="bytes shorter"):
            _check_socket_paths(ns)


class _ProbeSocket:
    """A probe socket whose kernel offers the ports in `offers`, in turn (the real one may repeat a port)."""

    def __init__(self, offers: Iterator[int]) -> None:
        self.port = next(offers)

    def __enter__(self) -> _ProbeSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def bind(self, address: tuple[str, int]) -> None:
        pass

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)


def test_free_port_never_hands_a_port_out_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    offers = iter([40001, 40001, 40001, 40002])
    monkeypatch.setattr(controlplane, "_HANDED_OUT", set())
    monkeypatch.setattr("tests.cluster.controlplane.socket.socket", lambda *a, **k: _ProbeSocket(offers))
    assert [controlplane.free_port(), controlplane.free_port()] == [40001, 40002]


def test_free_port_skips_a_port_another_live_process_claimed(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    offers = iter([40001, 40002, 40003])
    monkeypatch.setattr(controlplane, "_HANDED_OUT", set())
    monkeypatch.setattr(controlplane, "PORT_CLAIMS", tmp_path)
    monkeypatch.setattr("tests.cluster.controlplane.socket.socket", lambda *a, **k: _ProbeSocket(offers))
    (tmp_path / "40001").write_text(str(os.getppid()))  # a live process (our parent) holds it
    (tmp_path / "40002").write_text("999999999")  # its owner is gone: taken over
    assert controlplane.free_port() == 40002
    assert (tmp_path / "40002").read_text() == str(os.getpid())


def test_free_port_is_a_real_free_port() -> None:
    import socket

    port = controlplane.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # nobody else holds it
    assert port not in {controlplane.free_port() for _ in range(20)}

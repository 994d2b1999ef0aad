"""The real node refuses, before starting anything, a cluster directory whose unix sockets would be too long
(CI once failed halfway up: containerd exits on a ttrpc socket path over 104 bytes)."""

from __future__ import annotations

import pytest

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

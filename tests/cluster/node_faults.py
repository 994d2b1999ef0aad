"""Node faults on the local multi-node cluster (nodes 1.. of tests/cluster/netnodes.py), for e2e tests:

- power_off: like a power cut. The node's link goes down first (a dead machine answers nothing, no TCP reset),
  then its kubelet, kube-proxy and containerd get SIGKILL and so do its pods' processes (shims, containers).
- partition: the node's link goes down and everything on it keeps running, cut off from the rest.
- heal / power_on undo them. After power_on the kubelet finds its old pods gone from the API and removes them.
- Drain is `kubectl drain` (the Eviction API), which needs nothing of this module.

Node 0 shares the host's network (it holds the control plane's address), so it has no link to cut.
"""

from __future__ import annotations

from pathlib import Path

from tests.cluster import netnodes, node
from tests.cluster import node_host as h
from tests.cluster.controlplane import StartError
from tests.cluster.node_images import respawn, restart_containerd


def index_of(node_name: str) -> int:
    """ddpjob-node-K -> K; node 0 (ddpjob-node) cannot be faulted."""
    prefix = netnodes.name(0)[:-1]
    if not node_name.startswith(prefix) or not node_name[len(prefix):].isdigit():
        raise StartError(f"{node_name} is not a network-namespace node (ddpjob-node-1, -2, ...): it cannot be faulted")
    return int(node_name[len(prefix):])


def _link(k: int, up: bool) -> None:
    h.run("ip", "link", "set", netnodes.veth(k), "up" if up else "down")


def partition(directory: Path, node_name: str) -> None:
    _link(index_of(node_name), up=False)


def heal(directory: Path, node_name: str) -> None:
    _link(index_of(node_name), up=True)


def power_off(directory: Path, node_name: str) -> None:
    k = index_of(node_name)
    _link(k, up=False)
    node.stop_node(node._state(directory), k, kill=True)


def power_on(directory: Path, node_name: str) -> None:
    """containerd, then the kubelet and kube-proxy, then the link (the node boots, then rejoins the network)."""
    k = index_of(node_name)
    ns = node._state(directory)
    restart_containerd(ns, k)
    for name in (f"kubelet-{k}", f"kube-proxy-{k}"):
        respawn(ns, name)
    _link(k, up=True)

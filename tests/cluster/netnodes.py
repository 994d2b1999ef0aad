"""More real nodes on one machine (issue 11): node 0 is tests/cluster/node.py's host-network node; nodes 1..N-1
each live in their own network namespace, so what is host-global for one node becomes per node:

- network: a netns `ddpjob-node-K` with a veth (host end `ddpvK` on the host bridge `ddpjob0`, 10.89.0.1/24) whose
  inner end is the node's address 10.89.0.(10+K); a pod bridge `cni0` of its own with pods on 10.88.K.0/24; the
  host routes 10.88.K.0/24 to the node. kube-proxy writes its iptables inside the netns, the kubelet's port 10250 is
  the netns's own.
- cgroups: the kubelet's `cgroupRoot` is /ddpjob-node-K, so its kubepods tree never meets node 0's.
- containerd: one per node with its own root, state and socket, started in the node's netns (nsenter --net only:
  the mount namespace stays the host's, so the kubelet's volume mounts are what containerd bind-mounts).
- images: imported once into node 0 and cloned into the others with hard links (clone_images), so a 6 GB image
  is stored once whatever the number of nodes.

Every piece is recorded in NodeState before it is made, and `down` removes it (deleting a netns removes its
iptables, conntrack and veths with it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from pathlib import Path

from tests.cluster import controlplane as cp
from tests.cluster import node_host as h
from tests.cluster.controlplane import ClusterState, StartError

HOST_BRIDGE = "ddpjob0"
#: On nodes 1.. only: pods that must land on a netns node select it (node 0 runs the operator in e2e).
LABEL = "ddpjob.io/netns-node"
HOST_IP = "10.89.0.1"
CGROUP_ROOT = Path("/sys/fs/cgroup")
# containerd directories that hold images: what clone_images copies (bolt databases as files, the rest as links).
IMAGE_DIRS = ("io.containerd.metadata.v1.bolt", "io.containerd.snapshotter.v1.overlayfs",
              "io.containerd.content.v1.content")


def name(k: int) -> str:
    return f"ddpjob-node-{k}"


def netns(k: int) -> str:
    return name(k)


def veth(k: int) -> str:
    return f"ddpv{k}"


def node_ip(k: int) -> str:
    return f"10.89.0.{10 + k}"


def pod_cidr(k: int) -> str:
    return f"10.88.{k}.0/24"


def pod_gateway(k: int) -> str:
    return f"10.88.{k}.1"


def in_netns(k: int, argv: list[str]) -> list[str]:
    """Only the network namespace: `ip netns exec` would also remount /sys (hiding the cgroup mounts) in a private
    mount namespace (hiding the kubelet's volume mounts from containerd)."""
    return ["nsenter", f"--net=/run/netns/{netns(k)}", "--", *argv]


def _cgroup_hierarchies() -> list[Path]:
    return [p for p in CGROUP_ROOT.iterdir() if p.is_dir() and not p.is_symlink()]


def network(nodes: int, record: list[str], save: object) -> None:
    """Host side of nodes 1..nodes-1: the host bridge, a netns and veth per node, routes, FORWARD rules.
    `record` gets each item before it is made (`save()` persists it), so a failure half-way is undone."""
    record.append(f"link:{HOST_BRIDGE}")
    save()  # type: ignore[operator]
    h.run("ip", "link", "add", HOST_BRIDGE, "type", "bridge")
    h.run("ip", "addr", "add", f"{HOST_IP}/24", "dev", HOST_BRIDGE)
    h.run("ip", "link", "set", HOST_BRIDGE, "up")
    for k in range(1, nodes):
        record += [f"netns:{netns(k)}", f"link:{veth(k)}", f"cgroup-root:{name(k)}"]
        save()  # type: ignore[operator]
        h.run("ip", "netns", "add", netns(k))
        h.run("ip", "link", "add", veth(k), "type", "veth", "peer", "name", "eth0", "netns", netns(k))
        h.run("ip", "link", "set", veth(k), "master", HOST_BRIDGE, "up")
        ip = ["ip", "netns", "exec", netns(k), "ip"]
        h.run(*ip, "link", "set", "lo", "up")
        h.run(*ip, "addr", "add", f"{node_ip(k)}/24", "dev", "eth0")
        h.run(*ip, "link", "set", "eth0", "up")
        h.run(*ip, "route", "add", "default", "via", HOST_IP)
        # Per netns: the node routes for its pods; bridged pod traffic inside it goes through its own iptables.
        h.run("ip", "netns", "exec", netns(k), "sysctl", "-qw", "net.ipv4.ip_forward=1")
        h.run("ip", "route", "add", pod_cidr(k), "via", node_ip(k))
        for hier in _cgroup_hierarchies():
            path = hier / name(k)
            path.mkdir(exist_ok=True)
            if hier.name == "cpuset":  # a new cpuset cgroup starts with no CPUs and no memory nodes
                for f in ("cpuset.cpus", "cpuset.mems"):
                    (path / f).write_text((hier / f).read_text())
    # Node-to-node and node-to-control-plane traffic crosses the host's FORWARD chain; nothing leaves the machine.
    for rule in (["-i", HOST_BRIDGE, "-j", "DROP"], ["-i", HOST_BRIDGE, "-o", HOST_BRIDGE, "-j", "ACCEPT"],
                 ["-i", HOST_BRIDGE, "-o", "cni0", "-j", "ACCEPT"], ["-i", "cni0", "-o", HOST_BRIDGE, "-j", "ACCEPT"]):
        h.run("iptables", "-I", "FORWARD", *rule, "-m", "comment", "--comment", h.COMMENT)


def remove_network(created: list[str]) -> None:
    """Undo `network`: netns (with its iptables, conntrack and inner veth ends), veths, bridge, cgroup roots."""
    for item in reversed(created):
        kind, _, value = item.partition(":")
        if kind == "netns":
            h.run("ip", "netns", "del", value, check=False)
        elif kind == "link":
            h.run("ip", "link", "del", value, check=False)
        elif kind == "cgroup-root":
            for hier in _cgroup_hierarchies():
                top = hier / value
                for cg in sorted((p for p in [top, *top.rglob("*")] if p.is_dir()), key=lambda p: -len(p.parts)):
                    with contextlib.suppress(OSError):
                        cg.rmdir()


def leftover_pids(created: list[str]) -> set[int]:
    """Processes still in one of our nodes' cgroup trees (containers whose shim died first)."""
    roots = [f":/{item.split(':', 1)[1]}/" for item in created if item.startswith("cgroup-root:")]
    found: set[int] = set()
    if not roots:
        return found
    for proc in (p for p in Path("/proc").iterdir() if p.name.isdigit()):
        with contextlib.suppress(OSError):
            text = (proc / "cgroup").read_text()
            if any(r in text for r in roots):
                found.add(int(proc.name))
    return found


def kill_pids(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def clone_images(sockets: dict[int, Path], roots: dict[int, Path], restart: object, *, source: Path | None = None,
                 also: tuple[Path, ...] = ()) -> None:
    """Give nodes 1.. node 0's images without storing them again: with every containerd stopped (their bolt
    databases closed), copy node 0's metadata databases and hard-link its snapshot and content trees. Layers are
    never written in place (containers write to their own upper directories), so sharing inodes is safe. Refused
    while any node has containers: the copied metadata would carry node 0's, or drop node K's. ``source``: copy
    from there to every node instead (a saved copy, node_images.restore); ``also``: more destinations (the saved
    copy itself, node_images.save)."""
    for k, sock in sockets.items():
        busy = h.run("ctr", "--address", str(sock), "-n", "k8s.io", "containers", "ls", "-q", check=False).split()
        if busy:
            raise StartError(f"node {k} already has {len(busy)} containers: import images into a multi-node "
                             "cluster before anything runs on it (or use NODES=1)")
    src = source or roots[0]
    restart(stop=True)  # type: ignore[operator]
    try:
        for dst in [*(r for r in roots.values() if r != src), *also]:
            _link_tree(src, dst)
    finally:
        restart(stop=False)  # type: ignore[operator]


def _link_tree(src: Path, dst: Path) -> None:
    """``dst``'s image directories become hard links of ``src``'s, its bolt databases real copies."""
    for sub in IMAGE_DIRS:
        shutil.rmtree(dst / sub, ignore_errors=True)
        if (src / sub).exists():
            dst.mkdir(parents=True, exist_ok=True)
            h.run("cp", "-al", str(src / sub), str(dst / sub))
    for db in src.rglob("*.db"):  # bolt files are written in place: real copies
        target = dst / db.relative_to(src)
        target.unlink(missing_ok=True)
        shutil.copy2(db, target)


def wait_nodes_ready(state: ClusterState, names: list[str], timeout: float = 120) -> None:
    ready = "jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=='Ready')].status} {end}"
    deadline = time.monotonic() + timeout
    out = ""
    while time.monotonic() < deadline:
        out = cp._kubectl(state, "get", "nodes", "-o", ready)
        states = dict(item.split("=", 1) for item in out.split())
        if all(states.get(n) == "True" for n in names):
            return
        time.sleep(0.5)
    raise StartError(f"nodes not Ready after {timeout:.0f}s: {out}")

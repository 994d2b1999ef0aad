"""What a real node leaves on the host, to prove `down` removed it: processes and mounts that name the cluster
directory, network links (cni0, ddpjob0, veths), routes to pod subnets, iptables rules and chains, kubepods and
per-node cgroup trees, the nodes' network namespaces, the lock file."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def _iptables(cmd: str) -> frozenset[str]:
    """Rules and user chains; counters, comments and the empty built-in tables iptables-nft creates are noise."""
    try:
        out = subprocess.run([f"{cmd}-save"], capture_output=True, text=True, check=False).stdout
    except FileNotFoundError:
        return frozenset()
    builtin = {"INPUT", "OUTPUT", "FORWARD", "PREROUTING", "POSTROUTING"}
    items = set()
    table = ""
    for line in out.splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith("-A "):
            items.add(f"{cmd} {table} {line}")
        elif line.startswith(":") and line[1:].split()[0] not in builtin:
            items.add(f"{cmd} {table} chain {line[1:].split()[0]}")
    # Only what a real node could have added: dockerd (another helper's) may change its own rules meanwhile.
    return frozenset(i for i in items if any(m in i for m in ("KUBE-", "CNI-", "ddpjob", "10.88.", "10.89.")))


def _links() -> frozenset[str]:
    """cni0 and veths that are on cni0 or on no bridge (a pod veth outliving cni0); dockerd's are on docker0."""
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=False).stdout
    found = set()
    for line in out.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        ours = "master" not in line or "master cni0" in line or "master ddpjob0" in line
        if name in ("cni0", "ddpjob0") or (name.startswith(("veth", "ddpv")) and ours):
            found.add(name)
    return frozenset(found)


def _processes(directory: str) -> frozenset[str]:
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if directory in cmdline:
            found.add(f"pid {proc.name}: {cmdline[:200]}")
    return frozenset(found)


@dataclass(frozen=True)
class HostSnapshot:
    processes: frozenset[str]
    mounts: frozenset[str]
    links: frozenset[str]
    iptables: frozenset[str]
    cgroups: frozenset[str]
    netns: frozenset[str]
    routes: frozenset[str]
    lock: bool

    @classmethod
    def take(cls, directory: Path) -> HostSnapshot:
        d = str(directory.resolve())
        mounts = frozenset(
            ln.split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines() if d in ln.split()[4]
        )
        return cls(
            processes=_processes(d),
            mounts=mounts,
            links=_links(),
            iptables=_iptables("iptables") | _iptables("ip6tables"),
            cgroups=frozenset(str(p) for pattern in ("*/kubepods", "*/ddpjob-node-*")
                              for p in Path("/sys/fs/cgroup").glob(pattern)),
            netns=frozenset(p.name for p in Path("/run/netns").glob("*")) if Path("/run/netns").is_dir()
            else frozenset(),
            routes=frozenset(ln for ln in subprocess.run(["ip", "route"], capture_output=True, text=True,
                                                         check=False).stdout.splitlines()
                             if ln.startswith(("10.88.", "10.89."))),
            lock=Path("/run/ddpjob-real-node.lock").exists(),
        )

    def left_since(self, before: HostSnapshot) -> dict[str, list[str]]:
        """What exists now and did not before (empty when the host is as it was)."""
        left = {
            "processes": sorted(self.processes - before.processes),
            "mounts": sorted(self.mounts - before.mounts),
            "links": sorted(self.links - before.links),
            "iptables": sorted(self.iptables - before.iptables),
            "cgroups": sorted(self.cgroups - before.cgroups),
            "netns": sorted(self.netns - before.netns),
            "routes": sorted(self.routes - before.routes),
            "lock": ["/run/ddpjob-real-node.lock"] if self.lock and not before.lock else [],
        }
        return {k: v for k, v in left.items() if v}

"""A real Kubernetes node beside the local control plane: containerd (CRI) + CNI bridge + kubelet + kube-proxy +
CoreDNS, so e2e tests run real containers. `prepare` runs before the control plane (the apiserver binds the node's
bridge address), `start` after it; `down` undoes exactly what was added, from what <dir>/node/state.json recorded:
processes, mounts, the bridge and its veths, iptables chains and rules, sysctls, cgroups.

Only one real node per machine: kube-proxy's iptables chains, the kubelet's port 10250 and the kubepods cgroups are
host-global, so a lock file names the cluster directory that owns them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from string import Template

from tests.cluster import controlplane as cp
from tests.cluster import netnodes
from tests.cluster import node_host as h
from tests.cluster.controlplane import ClusterState, StartError
from tests.cluster.pki import write_kubeconfig

TEMPLATES = cp.REPO / "hack" / "node"
NODE_NAME = "ddpjob-node"
LABEL = "ddpjob.io/real-node"
BRIDGE = "cni0"
# The node IP is the bridge's own address: this VM has no dummy interfaces, and an address on a bridge we create
# keeps the apiserver, kubelet and CoreDNS off the host's real interfaces while pods reach them directly.
NODE_IP = "10.88.0.1"
POD_CIDR = "10.88.0.0/16"
DNS_IP = "10.96.0.10"
STORAGE_CLASS = "ddpjob-local"
# Local PVs are Retain (no provisioner could delete them), so each claim uses one up: enough for an e2e session.
PV_COUNT = int(os.environ.get("DDPJOB_REAL_NODE_PVS", "24"))
PAUSE_IMAGE = "ddpjob.local/pause:3.10"
COMMENT = h.COMMENT
LOCK = Path("/run/ddpjob-real-node.lock")
# Host-wide sysctls that the bridge plugin, the kubelet (setupKernelTunables) or we change; restored by `down`.
SYSCTLS = (
    "net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables",
    "net/ipv4/conf/all/route_localnet", "vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic",
    "kernel/panic_on_oops", "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
)
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass
class NodeState:
    """What `down` needs: written before each change so a failed `up` can be undone too."""

    dir: str
    pids: dict[str, int] = field(default_factory=dict)
    sysctls: dict[str, str] = field(default_factory=dict)
    created: list[str] = field(default_factory=list)  # "bridge", "lock", "dir:<path>", "cgroup:<name>", netnodes'
    nodes: int = 1
    argv: dict[str, list[str]] = field(default_factory=dict)  # how each process started, to start it again
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def node_dir(self) -> Path:
        return Path(self.dir) / "node"

    def dir_of(self, k: int) -> Path:
        """Node 0 keeps the single-node layout; node K's files live below it (one unmount/rmtree covers all)."""
        return self.node_dir / f"n{k}" if k else self.node_dir

    def socket_of(self, k: int) -> Path:
        # Node K's is one level up: sun_path holds 108 bytes, and pytest's directories are long already.
        return self.dir_of(k) / ("containerd.sock" if k else "containerd/containerd.sock")

    @property
    def socket(self) -> Path:
        return self.socket_of(0)

    def name_of(self, k: int) -> str:
        return netnodes.name(k) if k else NODE_NAME

    def save(self) -> None:
        (self.node_dir / "state.json").write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, directory: Path) -> NodeState | None:
        path = directory / "node" / "state.json"
        return cls(**json.loads(path.read_text())) if path.exists() else None


def _render(name: str, dest: Path, **values: object) -> Path:
    dest.write_text(Template((TEMPLATES / name).read_text()).substitute({k: str(v) for k, v in values.items()}))
    return dest


def _node_tool(name: str) -> Path:
    """kubelet, kube-proxy, coredns: built by `hack/install-tools.sh --node` (controlplane.tool() omits --node)."""
    v = cp.versions()
    # CoreDNS's directory also names its plugin set (hack/versions.env, COREDNS_PLUGIN_SET).
    version = f"{v['COREDNS_VERSION']}-{v['COREDNS_PLUGIN_SET']}" if name == "coredns" else v["KUBERNETES_VERSION"]
    cache = Path(os.environ.get("DDPJOB_CACHE", Path.home() / ".cache" / "ddpjob"))
    path = cache / "bin" / f"{name}-{version}" / name
    if not path.exists():
        subprocess.run([str(cp.REPO / "hack" / "install-tools.sh"), "--node"], check=False)
    if not path.exists():
        raise StartError(f"{name} {version} is not in {path.parent}; run hack/install-tools.sh --node")
    return path


def _check_host() -> None:
    if os.geteuid() != 0:
        raise StartError("a real node needs root (mounts, bridge, iptables, cgroups)")
    # The package list lives in one place, the script that installs them (`make node-tools`).
    proc = subprocess.run(["bash", str(cp.REPO / "hack" / "node-packages.sh"), "--check"],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise StartError(proc.stderr.strip())


def _take_lock(directory: Path, t0: float) -> None:
    if LOCK.exists():
        owner = Path(LOCK.read_text().strip())
        old = NodeState.load(owner)
        if old and owner != directory and any(h.running(p) for p in old.pids.values()):
            raise StartError(f"a real node from {owner} is running on this machine (only one can); "
                             f"stop it first: python -m tests.cluster down --dir {owner}")
        if old:
            cp.log(f"cleaning up a stale real node from {owner}", t0)
            down(owner, quiet=True)
    if h.run("ip", "link", "show", BRIDGE, check=False):
        raise StartError(f"bridge {BRIDGE} exists but no ddpjob real node owns it; remove it: ip link del {BRIDGE}")
    LOCK.write_text(f"{directory}\n")


def prepare(directory: Path, t0: float, nodes: int = 1) -> str:
    """Before the control plane: host checks, the lock, snapshots of iptables and sysctls, the bridge (and, for
    `nodes` > 1, the network namespaces of nodes 1..; tests/cluster/netnodes.py).
    Returns the address the apiserver must bind and advertise."""
    _check_host()
    for name in ("kubelet", "kube-proxy", "coredns"):
        _node_tool(name)
    node_dir = directory / "node"
    node_dir.mkdir(parents=True, exist_ok=True)
    pki = directory / "pki"
    crt = pki / "apiserver.crt"
    # A PKI made for a loopback-only cluster lacks the node IP in the apiserver's SANs; make a new one.
    if crt.exists() and NODE_IP not in h.run("openssl", "x509", "-in", str(crt), "-noout", "-ext", "subjectAltName"):
        shutil.rmtree(pki)
    if nodes < 1:
        raise StartError(f"nodes must be at least 1, not {nodes}")
    ns = NodeState(dir=str(directory), nodes=nodes)
    _check_socket_paths(ns)
    _take_lock(directory, t0)
    ns.created.append("lock")
    ns.sysctls = {k: v for k in SYSCTLS if (v := h.sysctl(k)) is not None}
    for cmd in ("iptables", "ip6tables", "nft"):
        (node_dir / f"{cmd}.before").write_text(h.run(*([cmd, "list", "tables"] if cmd == "nft" else [f"{cmd}-save"]),
                                                     check=False) if shutil.which(cmd) else "")
    for d in ("/run/containerd", "/run/containerd/s"):
        if not Path(d).exists():
            ns.created.append(f"dir:{d}")
    cg = [c.name for c in CGROUP_ROOT.iterdir() if c.is_dir() and not (c / "kubepods").exists()]
    ns.created += [f"cgroup:{c}" for c in cg]
    ns.created.append("bridge")
    ns.save()
    cp.log(f"real node: bridge {BRIDGE} {NODE_IP}, iptables forward rules", t0)
    h.run("ip", "link", "add", BRIDGE, "type", "bridge")
    # With more nodes node 0's pods get 10.88.0.0/24 and node K's 10.88.K.0/24, routed through the host.
    h.run("ip", "addr", "add", f"{NODE_IP}/{24 if nodes > 1 else 16}", "dev", BRIDGE)
    h.run("ip", "link", "set", BRIDGE, "up")
    h.sysctl("net/ipv4/ip_forward", "1")
    # Bridged pod-to-pod traffic passes FORWARD (br_netfilter), where dockerd may have set policy DROP: accept it.
    # Pods get no route off this machine: with ip_forward on, anything else they send would leave via eth0.
    for rule in (["-j", "DROP"], ["-o", BRIDGE, "-j", "ACCEPT"]):  # each -I goes on top: ACCEPT ends up first
        h.run("iptables", "-I", "FORWARD", "-i", BRIDGE, *rule, "-m", "comment", "--comment", COMMENT)
    if nodes > 1:
        cp.log(f"real nodes 1..{nodes - 1}: network namespaces, veths on {netnodes.HOST_BRIDGE}, routes", t0)
        netnodes.network(nodes, ns.created, ns.save)
    return NODE_IP


def start(state: ClusterState, t0: float, taint: str = "") -> None:
    """After the control plane: per node containerd, images, kubelet, kube-proxy; then CoreDNS, the DNS Service and
    local PVs that every node can mount (they are directories on this one machine). ``taint``: each kubelet
    registers its node with it (key=value:effect), for pods already waiting that must not start before the images
    are in (tests/cluster/node_images.py shares them only while nothing runs)."""
    d = Path(state.dir)
    ns = NodeState.load(d)
    assert ns is not None, "prepare() first"
    nd = ns.node_dir
    cp.log("real node: images (pause, probe)", t0)
    cache = Path(os.environ.get("DDPJOB_CACHE", Path.home() / ".cache" / "ddpjob"))
    images = Path(h.run(str(TEMPLATES / "build-images.sh"), str(cache / "images")).strip().splitlines()[-1])
    (nd / "resolv.conf").write_text(f"nameserver {NODE_IP}\n")
    (nd / "volumes").mkdir(parents=True, exist_ok=True)
    for k in range(ns.nodes):
        cp.log(f"real node {ns.name_of(k)}: containerd, kubelet, kube-proxy", t0)
        _start_node(state, ns, k, [images / "pause.tar", images / "probe.tar"], taint)
    kubeconfig = str(state.kubeconfig)
    corefile = _render("Corefile", nd / "Corefile", node_ip=NODE_IP, kubeconfig=kubeconfig)
    coredns = _spawn(state, ns, "coredns", [str(_node_tool("coredns")), "-conf", str(corefile)])

    names = [ns.name_of(k) for k in range(ns.nodes)]
    manifests = [_render("cluster.yaml", nd / "cluster.yaml", dns_ip=DNS_IP, node_ip=NODE_IP,
                         node_name=NODE_NAME, storage_class=STORAGE_CLASS,
                         apiserver_port=state.ports["apiserver"]).read_text()]
    for i in range(PV_COUNT):
        path = nd / "volumes" / f"pv-{i}"
        path.mkdir(exist_ok=True)
        manifests.append(Template((TEMPLATES / "pv.yaml").read_text()).substitute(
            name=f"{NODE_NAME}-pv-{i}", storage_class=STORAGE_CLASS, path=path, node_names=", ".join(names)))
    # One default class: ddpjob-local (hack/node/cluster.yaml says why) replaces the hostPath `standard`.
    cp._kubectl(state, "annotate", "storageclass", "standard", "--overwrite",
                "storageclass.kubernetes.io/is-default-class=false")
    cp._kubectl(state, "apply", "-f", "-", stdin="\n---\n".join(manifests))
    netnodes.wait_nodes_ready(state, names)
    for k in range(ns.nodes):
        health = f"http://{netnodes.node_ip(k) if k else '127.0.0.1'}:{ns.ports[f'kube-proxy-{k}']}/healthz"
        cp._wait("kube-proxy", _PROCS[_named("kube-proxy", k)], partial(cp._insecure_ok, health), state, 60)
    cp._wait("coredns", coredns, lambda: _tcp_ok(NODE_IP, 53), state)
    if "kwok" not in state.pids:  # a plain cluster (addons=False): no kwok nodes
        cp.log(f"real nodes {', '.join(names)} ready", t0)
        return
    cp.log(f"real nodes {', '.join(names)} ready; kwok nodes tainted kwok.x-k8s.io/node=fake:NoSchedule", t0)


def join(state: ClusterState, nodes: int, taint: str = "") -> None:
    """Real nodes for a control plane started with `up(..., nodes_later=True)`, once this machine's real-node slot
    is free: `prepare` and `start` (``taint`` as there), with the kubeconfig now naming the bridge address (nodes 1..
    reach the apiserver from their network namespaces, where loopback is their own; running clients keep the
    loopback they read)."""
    t0 = time.monotonic()
    d = Path(state.dir)
    try:
        prepare(d, t0, nodes)
        write_kubeconfig(state.kubeconfig, f"https://{NODE_IP}:{state.ports['apiserver']}", d / "pki")
        start(state, t0, taint)
    except BaseException:
        stop(d)
        down(d, quiet=True)
        raise


def _named(process: str, k: int) -> str:
    return f"{process}-{k}" if k else process


def _check_socket_paths(ns: NodeState) -> None:
    """Fail before anything starts, naming the fix, rather than as a containerd exit halfway up: containerd refuses
    its ttrpc socket (its socket + ".ttrpc") past 104 bytes, its portable limit. (The kubelet only logs a too-long
    pod-resources socket and runs on.)"""
    for k in range(ns.nodes):
        path = f"{ns.socket_of(k)}.ttrpc"
        if len(path) > 104:
            raise StartError(f"{path} is {len(path)} bytes, over the 104 containerd allows a socket path; "
                             f"use a cluster directory at least {len(path) - 104} bytes shorter")


def _start_node(state: ClusterState, ns: NodeState, k: int, images: list[Path], taint: str = "") -> None:
    """containerd (with the small images), kubelet and kube-proxy of node k; node K>0 in its network namespace."""
    nd = ns.dir_of(k)
    for sub in ("containerd", "cni/net.d", "cni/ipam", "kubelet", "pod-logs", "volume-plugins"):
        (nd / sub).mkdir(parents=True, exist_ok=True)
    multi = ns.nodes > 1
    ip = netnodes.node_ip(k) if k else NODE_IP
    cd = nd / "containerd"
    _render("containerd.toml", cd / "config.toml", root=cd / "root", state=cd / "state", socket=ns.socket_of(k),
            opt=cd / "opt", pause_image=PAUSE_IMAGE, runc_root=cd / "runc", cni_conf_dir=nd / "cni/net.d",
            registry_hosts=cd / "certs.d")
    gateway = netnodes.pod_gateway(k) if multi else NODE_IP
    _render("cni.conflist", nd / "cni/net.d/10-ddpjob.conflist", bridge=BRIDGE, ipam_dir=nd / "cni/ipam",
            pod_cidr=netnodes.pod_cidr(k) if multi else POD_CIDR, node_ip=gateway,
            range_start=gateway.rsplit(".", 1)[0] + ".10")
    _spawn(state, ns, _named("containerd", k), ["containerd", "--config", str(cd / "config.toml")], k)
    cp._wait("containerd", _PROCS[_named("containerd", k)], lambda: bool(_ctr(ns, "version", node=k)), state)
    for tar in images:
        _ctr(ns, "images", "import", "--no-unpack", str(tar), node=k)
    ns.ports[f"kube-proxy-{k}"] = cp.free_port()
    kubelet_cfg = _render(
        "kubelet.yaml", nd / "kubelet.yaml", socket=ns.socket_of(k), node_ip=ip, healthz_port=cp.free_port(),
        ca=Path(state.dir) / "pki" / "ca.crt", dns_ip=DNS_IP, resolv_conf=ns.node_dir / "resolv.conf",
        pod_logs=nd / "pod-logs", volume_plugin_dir=nd / "volume-plugins",
        cgroup_root=f"/{netnodes.name(k)}" if k else "/",
    )
    labels = f"{LABEL}=true,{LABEL}-index={k}" + (f",{netnodes.LABEL}=true" if k else "")
    _spawn(state, ns, _named("kubelet", k), [
        str(_node_tool("kubelet")), f"--config={kubelet_cfg}", f"--kubeconfig={state.kubeconfig}",
        f"--root-dir={nd / 'kubelet'}", f"--node-ip={ip}", f"--hostname-override={ns.name_of(k)}",
        f"--node-labels={labels}", *([f"--register-with-taints={taint}"] if taint else []),
        # A negative OOM score needs CAP_SYS_RESOURCE, which this VM lacks.
        "--oom-score-adj=0", "--v=1",
    ], k)
    proxy_cfg = _render("kube-proxy.yaml", nd / "kube-proxy.yaml", kubeconfig=state.kubeconfig,
                        node_name=ns.name_of(k), pod_cidr=POD_CIDR, node_ip=ip,
                        # Node K's loopback is its netns's own: its health port must be on its address.
                        health_host=ip if k else "127.0.0.1", healthz_port=ns.ports[f"kube-proxy-{k}"],
                        metrics_port=cp.free_port())
    _spawn(state, ns, _named("kube-proxy", k), [str(_node_tool("kube-proxy")), f"--config={proxy_cfg}", "--v=1"], k)


def _spawn(state: ClusterState, ns: NodeState, name: str, argv: list[str], k: int = 0) -> subprocess.Popen[bytes]:
    argv = netnodes.in_netns(k, argv) if k else argv
    proc = cp._start(state, name, argv)  # also in the control plane's state, so its `down` would kill it too
    ns.pids[name] = proc.pid
    ns.argv[name] = argv
    ns.save()
    _PROCS[name] = proc
    return proc


#: Processes this Python process started (for cp._wait, which watches a Popen); keyed like NodeState.pids.
_PROCS: dict[str, subprocess.Popen[bytes]] = {}


def _tcp_ok(host: str, port: int) -> bool:
    socket.create_connection((host, port), timeout=1).close()
    return True


def _ctr_argv(ns: NodeState, *args: str, node: int = 0) -> list[str]:
    return ["ctr", "--address", str(ns.socket_of(node)), "--namespace", "k8s.io", *args]


def _ctr(ns: NodeState, *args: str, check: bool = True, node: int = 0) -> str:
    return h.run(*_ctr_argv(ns, *args, node=node), check=check)


def _state(directory: Path) -> NodeState:
    ns = NodeState.load(directory.resolve())
    if ns is None:
        raise StartError(f"no real node in {directory}")
    return ns


def _shims(sockets: list[Path]) -> set[int]:
    """Shims of the containerds listening on `sockets` (they re-parent to init, so killpg misses them)."""
    wanted = [str(sock).encode() for sock in sockets]
    found: set[int] = set()
    for proc in (p for p in Path("/proc").iterdir() if p.name.isdigit()):
        with contextlib.suppress(OSError):
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if argv[0].endswith(b"containerd-shim-runc-v2") and any(w in argv for w in wanted):
                found.add(int(proc.name))
    return found


def _leftover_pids(ns: NodeState) -> set[int]:
    """Shims of *our* containerds and anything in a kubepods cgroup (node 0's at the root, node K's below
    /ddpjob-node-K)."""
    found = netnodes.leftover_pids(ns.created) | _shims([ns.socket_of(k) for k in range(ns.nodes)])
    if "lock" in ns.created:
        for proc in (p for p in Path("/proc").iterdir() if p.name.isdigit()):
            with contextlib.suppress(OSError):
                if ":/kubepods" in (proc / "cgroup").read_text():
                    found.add(int(proc.name))
    return found


def stop_node(ns: NodeState, k: int, *, kill: bool = False) -> None:
    """Stop node k's kubelet, kube-proxy and containerd. kill=True is a power cut: SIGKILL, and its containers'
    processes die with it; otherwise containers are deleted through containerd first."""
    names = [_named(n, k) for n in ("kubelet", "kube-proxy")]
    pids = [ns.pids[n] for n in names if n in ns.pids]
    containerd = ns.pids.get(_named("containerd", k))
    if kill:
        if k == 0:
            raise StartError("node 0 holds the control plane's address and cannot be powered off; use node 1..")
        netnodes.kill_pids({*pids, *([containerd] if containerd else [])})
        netnodes.kill_pids(_shims([ns.socket_of(k)]) | netnodes.leftover_pids([f"cgroup-root:{netnodes.name(k)}"]))
        return
    h.stop_pids(pids)
    if containerd and h.running(containerd) and ns.socket_of(k).exists():
        for cid in _ctr(ns, "tasks", "ls", "-q", check=False, node=k).split():  # -f: SIGKILL, then delete
            _ctr(ns, "tasks", "delete", "-f", cid, check=False, node=k)
    if containerd:
        h.stop_pids([containerd])


def stop(directory: Path) -> None:
    """Stop every node's processes and containers and unmount what they mounted (idempotent)."""
    ns = NodeState.load(directory.resolve())
    if ns is None:
        return
    # The kubelets first (with the rest, in parallel): they would restart containers we kill.
    h.stop_pids([ns.pids[n] for n in ns.pids if n.startswith(("coredns", "kube-proxy", "kubelet"))])
    for k in range(ns.nodes):
        stop_node(ns, k)
    # Anything still running in a pod (a shim that outlived containerd, its container) dies by PID.
    netnodes.kill_pids(_leftover_pids(ns))
    time.sleep(0.2)
    h.unmount_under(ns.node_dir)


def down(directory: Path, *, quiet: bool = False) -> None:
    """Undo the real node: processes, containers, mounts, veths and bridge, iptables, sysctls, cgroups, lock."""
    directory = directory.resolve()
    stop(directory)
    ns = NodeState.load(directory)
    if ns is None:
        return
    nd = ns.node_dir
    if "bridge" in ns.created:
        for line in h.run("ip", "-o", "link", "show", "master", BRIDGE, check=False).splitlines():
            h.run("ip", "link", "del", line.split(":")[1].strip().split("@")[0], check=False)
        h.run("ip", "link", "del", BRIDGE, check=False)
    netnodes.remove_network(ns.created)
    for cmd in ("iptables", "ip6tables"):
        h.iptables_undo(cmd, nd / f"{cmd}.before")
    h.nft_undo(nd / "nft.before")
    for flag in ("-s", "-d"):  # NAT and connection-tracking state of pod and node-address flows
        for cidr in (POD_CIDR, f"{netnodes.HOST_IP}/24"):
            h.run("conntrack", "-D", flag, cidr, check=False)
    for key, value in ns.sysctls.items():
        if h.sysctl(key) != value:
            h.sysctl(key, value)
    for top in (CGROUP_ROOT / c[7:] / "kubepods" for c in ns.created if c.startswith("cgroup:")):
        for cg in sorted((p for p in [top, *top.rglob("*")] if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):  # the kubelet's kubepods tree in each hierarchy, leaves first
                cg.rmdir()
    h.remove_stale_sockets(Path("/run/containerd/s"))
    for item in reversed(ns.created):
        if item.startswith("dir:"):
            # Only if empty: dockerd's own containerd may keep its shim sockets in /run/containerd/s too.
            with contextlib.suppress(OSError):
                os.rmdir(item[4:])
    for sub in ("containerd", "kubelet", "cni", "volumes", "pod-logs", "volume-plugins",
                *(f"n{k}" for k in range(1, ns.nodes))):
        shutil.rmtree(nd / sub, ignore_errors=True)
    if "lock" in ns.created and LOCK.exists() and LOCK.read_text().strip() == str(directory):
        LOCK.unlink()
    (nd / "state.json").unlink()
    if not quiet:
        print(f"real node in {nd} removed", file=sys.stderr, flush=True)

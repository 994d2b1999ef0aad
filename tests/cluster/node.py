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
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from string import Template
from typing import IO

from tests.cluster import controlplane as cp
from tests.cluster import node_host as h
from tests.cluster.controlplane import ClusterState, StartError

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
    created: list[str] = field(default_factory=list)  # "bridge", "lock", "dir:<path>", "cgroup:<name>"

    @property
    def node_dir(self) -> Path:
        return Path(self.dir) / "node"

    @property
    def socket(self) -> Path:
        return self.node_dir / "containerd" / "containerd.sock"

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
    version = v["COREDNS_VERSION"] if name == "coredns" else v["KUBERNETES_VERSION"]
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


def prepare(directory: Path, t0: float) -> str:
    """Before the control plane: host checks, the lock, snapshots of iptables and sysctls, the bridge.
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
    ns = NodeState(dir=str(directory))
    if len(str(ns.socket)) > 100:  # sun_path holds 108 bytes
        raise StartError(f"{ns.socket} is too long for a unix socket path; use a shorter cluster directory")
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
    h.run("ip", "addr", "add", f"{NODE_IP}/16", "dev", BRIDGE)
    h.run("ip", "link", "set", BRIDGE, "up")
    h.sysctl("net/ipv4/ip_forward", "1")
    # Bridged pod-to-pod traffic passes FORWARD (br_netfilter), where dockerd may have set policy DROP: accept it.
    # Pods get no route off this machine: with ip_forward on, anything else they send would leave via eth0.
    for rule in (["-j", "DROP"], ["-o", BRIDGE, "-j", "ACCEPT"]):  # each -I goes on top: ACCEPT ends up first
        h.run("iptables", "-I", "FORWARD", "-i", BRIDGE, *rule, "-m", "comment", "--comment", COMMENT)
    return NODE_IP


def start(state: ClusterState, t0: float) -> None:
    """After the control plane: containerd, images, kubelet, kube-proxy, CoreDNS, DNS Service, local PVs."""
    d = Path(state.dir)
    ns = NodeState.load(d)
    assert ns is not None, "prepare() first"
    nd = ns.node_dir
    for sub in ("containerd", "cni/net.d", "cni/ipam", "kubelet", "pod-logs", "volume-plugins", "volumes"):
        (nd / sub).mkdir(parents=True, exist_ok=True)
    bins = {n: str(_node_tool(n)) for n in ("kubelet", "kube-proxy", "coredns")}
    kubeconfig = str(state.kubeconfig)

    cp.log("real node: images (pause, probe)", t0)
    cache = Path(os.environ.get("DDPJOB_CACHE", Path.home() / ".cache" / "ddpjob"))
    images = Path(h.run(str(TEMPLATES / "build-images.sh"), str(cache / "images")).strip().splitlines()[-1])

    cp.log("real node: containerd", t0)
    cd = nd / "containerd"
    _render("containerd.toml", cd / "config.toml", root=cd / "root", state=cd / "state", socket=ns.socket,
            opt=cd / "opt", pause_image=PAUSE_IMAGE, runc_root=cd / "runc", cni_conf_dir=nd / "cni/net.d")
    _render("cni.conflist", nd / "cni/net.d/10-ddpjob.conflist", bridge=BRIDGE, ipam_dir=nd / "cni/ipam",
            pod_cidr=POD_CIDR, node_ip=NODE_IP, range_start="10.88.0.10")
    containerd = _spawn(state, ns, "containerd", ["containerd", "--config", str(cd / "config.toml")])
    cp._wait("containerd", containerd, lambda: bool(_ctr(ns, "version")), state)
    import_images(d, [images / "pause.tar", images / "probe.tar"])

    cp.log("real node: kubelet, kube-proxy, coredns", t0)
    (nd / "resolv.conf").write_text(f"nameserver {NODE_IP}\n")
    kubelet_cfg = _render(
        "kubelet.yaml", nd / "kubelet.yaml", socket=ns.socket, node_ip=NODE_IP, healthz_port=cp.free_port(),
        ca=d / "pki" / "ca.crt", dns_ip=DNS_IP, resolv_conf=nd / "resolv.conf", pod_logs=nd / "pod-logs",
        volume_plugin_dir=nd / "volume-plugins",
    )
    kubelet = _spawn(state, ns, "kubelet", [
        bins["kubelet"], f"--config={kubelet_cfg}", f"--kubeconfig={kubeconfig}", f"--root-dir={nd / 'kubelet'}",
        f"--node-ip={NODE_IP}", f"--hostname-override={NODE_NAME}", f"--node-labels={LABEL}=true",
        # A negative OOM score needs CAP_SYS_RESOURCE, which this VM lacks.
        "--oom-score-adj=0", "--v=1",
    ])
    proxy_health = cp.free_port()
    proxy_cfg = _render("kube-proxy.yaml", nd / "kube-proxy.yaml", kubeconfig=kubeconfig, node_name=NODE_NAME,
                        pod_cidr=POD_CIDR, node_ip=NODE_IP, healthz_port=proxy_health, metrics_port=cp.free_port())
    proxy = _spawn(state, ns, "kube-proxy", [bins["kube-proxy"], f"--config={proxy_cfg}", "--v=1"])
    corefile = _render("Corefile", nd / "Corefile", node_ip=NODE_IP, kubeconfig=kubeconfig)
    coredns = _spawn(state, ns, "coredns", [bins["coredns"], "-conf", str(corefile)])

    manifests = [_render("cluster.yaml", nd / "cluster.yaml", dns_ip=DNS_IP, node_ip=NODE_IP,
                         node_name=NODE_NAME, storage_class=STORAGE_CLASS,
                         apiserver_port=state.ports["apiserver"]).read_text()]
    for i in range(PV_COUNT):
        path = nd / "volumes" / f"pv-{i}"
        path.mkdir(exist_ok=True)
        manifests.append(Template((TEMPLATES / "pv.yaml").read_text()).substitute(
            name=f"{NODE_NAME}-pv-{i}", storage_class=STORAGE_CLASS, path=path, node_name=NODE_NAME))
    # One default class: ddpjob-local (hack/node/cluster.yaml says why) replaces the hostPath `standard`.
    cp._kubectl(state, "annotate", "storageclass", "standard", "--overwrite",
                "storageclass.kubernetes.io/is-default-class=false")
    cp._kubectl(state, "apply", "-f", "-", stdin="\n---\n".join(manifests))

    ready = "jsonpath={.status.conditions[?(@.type=='Ready')].status}"
    cp._wait("kubelet", kubelet, lambda: cp._kubectl(state, "get", "node", NODE_NAME, "-o", ready) == "True",
             state, 120)
    cp._wait("kube-proxy", proxy, lambda: cp._insecure_ok(f"http://127.0.0.1:{proxy_health}/healthz"), state, 60)
    cp._wait("coredns", coredns, lambda: _tcp_ok(NODE_IP, 53), state)
    # Untainted kwok nodes would take Deployments (the operator) and fake-run them; real-node e2e wants real pods.
    cp._kubectl(state, "taint", "nodes", "-l", "type=kwok", "kwok.x-k8s.io/node=fake:NoSchedule", "--overwrite")
    cp.log(f"real node {NODE_NAME} ready ({NODE_IP}); kwok nodes tainted kwok.x-k8s.io/node=fake:NoSchedule", t0)


def _spawn(state: ClusterState, ns: NodeState, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
    proc = cp._start(state, name, argv)  # also in the control plane's state, so its `down` would kill it too
    ns.pids[name] = proc.pid
    ns.save()
    return proc


def _tcp_ok(host: str, port: int) -> bool:
    socket.create_connection((host, port), timeout=1).close()
    return True


def _ctr_argv(ns: NodeState, *args: str) -> list[str]:
    return ["ctr", "--address", str(ns.socket), "--namespace", "k8s.io", *args]


def _ctr(ns: NodeState, *args: str, check: bool = True) -> str:
    return h.run(*_ctr_argv(ns, *args), check=check)


def _state(directory: Path) -> NodeState:
    ns = NodeState.load(directory.resolve())
    if ns is None:
        raise StartError(f"no real node in {directory}")
    return ns


def import_images(directory: Path, tarballs: list[Path]) -> None:
    """Import `docker save` / docker-archive tarballs into the real node's containerd (k8s.io namespace)."""
    ns = _state(directory)
    for tar in tarballs:
        _ctr(ns, "images", "import", "--no-unpack", str(tar))


def import_unpacked(directory: Path, image: str, archive: IO[bytes]) -> int:
    """Import a `docker save` stream, unpack it into the overlayfs snapshotter now, then delete its layer blobs:
    the snapshots are all a container needs, and keeping both would hold a 6 GB image twice on a disk whose
    running low makes the kubelet evict pods and images (docs/e2e.md). Returns the bytes of blobs discarded.
    containerd 1.6 (Debian's) has no `discard_unpacked_layers` for imports, so this is what that option does."""
    ns = _state(directory)
    proc = subprocess.run(_ctr_argv(ns, "images", "import", "-"), stdin=archive, capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise StartError(f"ctr images import {image} failed ({proc.returncode}): {proc.stderr.strip()}")
    ref = _normalized(image)
    # `images check` columns: REF TYPE DIGEST STATUS SIZE UNPACKED; unpacked is what makes the blobs redundant.
    row = next((line.split() for line in _ctr(ns, "images", "check", f"name=={ref}").splitlines()[1:]
                if line.split()[:1] == [ref]), None)
    if row is None or row[-1] != "true":
        raise StartError(f"{ref} is not unpacked after import: {row}")
    layers = _layer_blobs(ns, row[2])
    if layers:
        _ctr(ns, "content", "rm", *layers)
    return sum(layers.values())


def _normalized(image: str) -> str:
    """The name containerd stores for a `docker save` of `image` (Docker's reference normalization)."""
    first, _, rest = image.partition("/")
    if not rest:
        return f"docker.io/library/{image}"
    return image if "." in first or ":" in first or first == "localhost" else f"docker.io/{image}"


def _layer_blobs(ns: NodeState, digest: str) -> dict[str, int]:
    """Layer digest -> size under a manifest or index (docker save writes either, by Docker version)."""
    doc = json.loads(_ctr(ns, "content", "get", digest))
    if "manifests" in doc:  # an index: its manifests whose content is here (other platforms were not imported)
        here = set(_ctr(ns, "content", "ls", "-q").split())
        return {k: v for m in doc["manifests"] if m["digest"] in here for k, v in _layer_blobs(ns, m["digest"]).items()}
    return {layer["digest"]: int(layer["size"]) for layer in doc.get("layers", [])}


def _leftover_pids(ns: NodeState) -> set[int]:
    """Shims of *our* containerd (they re-parent to init, so killpg misses them) and anything in a kubepods cgroup."""
    found = set()
    for proc in (p for p in Path("/proc").iterdir() if p.name.isdigit()):
        with contextlib.suppress(OSError):
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            shim = argv[0].endswith(b"containerd-shim-runc-v2") and str(ns.socket).encode() in argv
            if shim or ("lock" in ns.created and ":/kubepods" in (proc / "cgroup").read_text()):
                found.add(int(proc.name))
    return found


def stop(directory: Path) -> None:
    """Stop the node's processes and containers and unmount what they mounted (idempotent)."""
    ns = NodeState.load(directory.resolve())
    if ns is None:
        return
    # The kubelet first (with the rest, in parallel): it would restart containers we kill.
    h.stop_pids([ns.pids[name] for name in ("coredns", "kube-proxy", "kubelet") if name in ns.pids])
    if "containerd" in ns.pids and h.running(ns.pids["containerd"]) and ns.socket.exists():
        for cid in _ctr(ns, "tasks", "ls", "-q", check=False).split():  # -f: SIGKILL, then delete
            _ctr(ns, "tasks", "delete", "-f", cid, check=False)
    if "containerd" in ns.pids:
        h.stop_pids([ns.pids["containerd"]])
    # Anything still running in a pod (a shim that outlived containerd, its container) dies by PID.
    for pid in _leftover_pids(ns):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
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
    for cmd in ("iptables", "ip6tables"):
        h.iptables_undo(cmd, nd / f"{cmd}.before")
    h.nft_undo(nd / "nft.before")
    for flag in ("-s", "-d"):  # NAT and connection-tracking state of pod and node-address flows
        h.run("conntrack", "-D", flag, POD_CIDR, check=False)
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
    for sub in ("containerd", "kubelet", "cni", "volumes", "pod-logs", "volume-plugins"):
        shutil.rmtree(nd / sub, ignore_errors=True)
    if "lock" in ns.created and LOCK.exists() and LOCK.read_text().strip() == str(directory):
        LOCK.unlink()
    (nd / "state.json").unlink()
    if not quiet:
        print(f"real node in {nd} removed", file=sys.stderr, flush=True)

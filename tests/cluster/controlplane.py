"""Start and stop the local control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok,
Kueue and scheduler-plugins (addons=False: not the last two, nor kwok beside a real node), all on loopback with free
ports, state and logs under one directory so `down` can undo everything `up` did."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.cluster import gang_scheduler, kueue
from tests.cluster.pki import make_pki, write_kubeconfig

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SERVICE_CIDR = "10.96.0.0/16"

#: kwok nodes: room for the scale benchmark (500 jobs x 5 pods, twice) and for GPU requests to schedule.
KWOK_NODES = 4
NODE_CAPACITY = {"cpu": "64", "memory": "512Gi", "pods": "3000", "nvidia.com/gpu": "8", "ephemeral-storage": "1Ti"}


def versions() -> dict[str, str]:
    """The pinned tool versions from hack/versions.env."""
    out = {}
    for line in (REPO / "hack" / "versions.env").read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def tool(name: str) -> Path:
    """Path of a cached tool binary, building the cache first when it is missing."""
    v = versions()
    version = {
        "etcd": v["ETCD_VERSION"],
        "kwok": v["KWOK_VERSION"],
        "helm": v["HELM_VERSION"],
        "coredns": f"{v['COREDNS_VERSION']}-{v['COREDNS_PLUGIN_SET']}",
        "scheduler-plugins": v["SCHEDULER_PLUGINS_VERSION"],
        "kueue": v["KUEUE_VERSION"],
        "promtool": v["PROMETHEUS_VERSION"],
        "prometheus": v["PROMETHEUS_VERSION"],
        "registry": v["DISTRIBUTION_VERSION"],
    }.get(name, v["KUBERNETES_VERSION"])
    cache = Path(os.environ.get("DDPJOB_CACHE", Path.home() / ".cache" / "ddpjob"))
    path = cache / "bin" / f"{name}-{version}" / name
    if not path.exists():
        proc = subprocess.run([str(REPO / "hack" / "install-tools.sh")], check=False)
        if proc.returncode != 0 or not path.exists():
            raise RuntimeError(f"{name} {version} is not in {path.parent} and hack/install-tools.sh could not build it")
    return path


#: Ports free_port handed out: each is free only until its process binds it, and the kernel may offer a port
#: again as soon as our probe socket closes (CI once gave etcd and kwok the same one).
_HANDED_OUT: set[int] = set()
#: One file per port handed out by any live test process on this machine (pytest-xdist runs several at once: a
#: port another process probed but did not bind yet looks free to this one). A file names its owner's PID; one
#: whose owner is gone is taken over.
PORT_CLAIMS = Path(os.environ.get("TMPDIR", "/tmp")) / "ddpjob-test-ports"


def _claim(port: int) -> bool:
    """Claim ``port`` for this process machine-wide; False when a live process has it."""
    PORT_CLAIMS.mkdir(parents=True, exist_ok=True)
    path = PORT_CLAIMS / str(port)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                owner = int(path.read_text() or 0)
                os.kill(owner, 0)
                if owner != os.getpid():
                    return False
            except (OSError, ValueError):  # its owner is gone (or it is half written): take it over
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            return True  # ours already (_HANDED_OUT was reset)
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False


def free_port() -> int:
    """A port nobody listens on right now (the kernel picks it), never one this process or any other live test
    process handed out before."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT and _claim(port):
            _HANDED_OUT.add(port)
            return port


@dataclass
class ClusterState:
    """What `down` needs to undo `up`: written to <dir>/state.json as soon as each process starts."""

    dir: str
    pids: dict[str, int] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def kubeconfig(self) -> Path:
        return Path(self.dir) / "kubeconfig"

    def save(self) -> None:
        (Path(self.dir) / "state.json").write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, directory: Path) -> ClusterState | None:
        path = directory / "state.json"
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        return cls(dir=data["dir"], pids=data["pids"], ports=data["ports"])


def log(msg: str, t0: float) -> None:
    print(f"[cluster {time.monotonic() - t0:5.1f}s] {msg}", file=sys.stderr, flush=True)


class StartError(RuntimeError):
    """A component did not come up; the message carries the tail of its log."""


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join("    " + ln for ln in path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "    (no log)"


def _start(state: ClusterState, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
    logs = Path(state.dir) / "logs"
    logs.mkdir(exist_ok=True)
    out = open(logs / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it; a restart appends to its log
    # A new session: the components outlive `make cluster-up`, and `down` signals the whole group.
    proc = subprocess.Popen(
        argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    out.close()
    state.pids[name] = proc.pid
    state.save()
    return proc


def _wait(
    name: str, proc: subprocess.Popen[bytes], check: Callable[[], bool], state: ClusterState, timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    last_err = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log_tail = _tail(Path(state.dir) / "logs" / f"{name}.log")
            raise StartError(f"{name} exited with code {proc.returncode}:\n{log_tail}")
        try:
            if check():
                return
        except Exception as err:
            last_err = str(err)
        time.sleep(0.2)
    raise StartError(
        f"{name} not ready after {timeout:.0f}s (last check: {last_err or 'not ready'}):\n"
        f"{_tail(Path(state.dir) / 'logs' / f'{name}.log')}"
    )


def _https_ok(url: str, pki: Path) -> bool:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    ctx.check_hostname = False
    with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
        return bool(resp.status == 200)


def _insecure_ok(url: str) -> bool:
    ctx = ssl._create_unverified_context()  # the components' self-signed serving certs; loopback only
    with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
        return bool(resp.status == 200)


def _kubectl(state: ClusterState, *args: str, stdin: str | None = None) -> str:
    proc = subprocess.run(
        ["kubectl", f"--kubeconfig={state.kubeconfig}", *args], input=stdin, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


#: The default StorageClass: kube-controller-manager's hostPath provisioner (under /tmp/hostpath_pv).
STORAGE_CLASS = """apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/host-path
reclaimPolicy: Delete
volumeBindingMode: Immediate
"""


def _node_manifest(i: int) -> str:
    name = f"kwok-node-{i}"
    capacity = "\n".join(f"    {k}: \"{v}\"" for k, v in NODE_CAPACITY.items())
    return f"""apiVersion: v1
kind: Node
metadata:
  name: {name}
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    kubernetes.io/hostname: {name}
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok
status:
  capacity:
{capacity}
  allocatable:
{capacity}
"""


def up(directory: Path, real_node: bool = False, nodes: int = 1, addons: bool = True,
       nodes_later: bool = False) -> ClusterState:
    """Start the control plane in `directory` (created if needed); on any failure, undo what was started.

    real_node: also run a real node (tests/cluster/node.py): the apiserver then binds and advertises the node's
    bridge address so pods reach it through the `kubernetes` Service. nodes: how many real nodes (node 1.. each in
    its own network namespace, tests/cluster/netnodes.py). addons=False: without Kueue and scheduler-plugins, and
    with a real node without kwok (none of them built): a plain cluster, as `make demo` needs (issue 44).
    nodes_later: no real node yet, but ready for `node.join` to add them once the machine's one real-node slot is
    free (a second cluster beside a real-node one, tests/e2e/test_multikueue.py): the apiserver binds every address
    and advertises the bridge address the nodes will have, and kwok's nodes are tainted from the start."""
    t0 = time.monotonic()
    directory = directory.resolve()
    if (old := ClusterState.load(directory)) is not None:
        log("a previous cluster state was found; stopping it first", t0)
        down(directory, quiet=True, state=old)
    directory.mkdir(parents=True, exist_ok=True)
    state = ClusterState(dir=str(directory))
    try:
        host = "127.0.0.1"
        if real_node:
            from tests.cluster import node

            host = node.prepare(directory, t0, nodes)
        _up(state, t0, host, addons, advertise=node_ip() if nodes_later else "")
        if real_node:
            node.start(state, t0)
    except BaseException:
        down(directory, quiet=True, state=state)
        raise
    log(f"ready: {KWOK_NODES if 'kwok' in state.pids else 0} kwok nodes, apiserver {_server(state)}", t0)
    return state


def _server(state: ClusterState) -> str:
    for line in state.kubeconfig.read_text().splitlines():
        if line.strip().startswith("server:"):
            return line.split(":", 1)[1].strip()
    return ""


def _start_addons(state: ClusterState, bins: dict[str, str]) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    """Kueue and scheduler-plugins' scheduler (with its PodGroup CRD), started; both waited for by the caller."""
    kueue_proc = kueue.start(state, Path(bins[kueue.NAME]))  # first: its CRDs and caches take longest
    # Before its scheduler starts: the coscheduling plugin watches PodGroups from its first moment.
    _kubectl(state, "apply", "--server-side", "-f", str(gang_scheduler.crd_path(Path(bins[gang_scheduler.NAME]))))
    gang = _start(state, gang_scheduler.NAME,
                  gang_scheduler.argv(Path(bins[gang_scheduler.NAME]), state, state.ports[gang_scheduler.NAME]))
    return kueue_proc, gang


def _start_kwok(state: ClusterState, binary: str, t0: float) -> None:
    """kwok and its KWOK_NODES simulated nodes, Ready."""
    kwok = _start(state, "kwok", [
        binary, f"--kubeconfig={state.kubeconfig}", "--manage-all-nodes=false",
        "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
        f"--config={HERE / 'kwok-stages.yaml'}", "--cidr=10.244.0.1/16", "--node-ip=10.0.0.1",
        f"--server-address=127.0.0.1:{state.ports['kwok']}",
    ])
    _wait("kwok", kwok, lambda: _insecure_ok(f"http://127.0.0.1:{state.ports['kwok']}/healthz"), state)
    log(f"{KWOK_NODES} kwok nodes", t0)
    _kubectl(state, "apply", "-f", "-", stdin="---\n".join(_node_manifest(i) for i in range(KWOK_NODES)))

    def nodes_ready() -> bool:
        out = _kubectl(state, "get", "nodes", "-o", "jsonpath={.items[*].status.conditions[?(@.type=='Ready')].status}")
        return out.split() == ["True"] * KWOK_NODES

    _wait("kwok", kwok, nodes_ready, state, 60)


def node_ip() -> str:
    from tests.cluster.node import NODE_IP

    return NODE_IP


def _up(state: ClusterState, t0: float, host: str = "127.0.0.1", addons: bool = True, advertise: str = "") -> None:
    d = Path(state.dir)
    # With a real node the apiserver listens on the node's bridge address so pods reach it (node.py publishes it as
    # the `kubernetes` Service's endpoint; the lease reconciler would hang the apiserver's shutdown once etcd is gone).
    # Nodes that join later: that address does not exist yet, so every address (loopback for the clients until then).
    real = host != "127.0.0.1" or bool(advertise)
    bind, advertise = ("0.0.0.0", advertise) if advertise else (host, host)
    pki = d / "pki"
    extra = (gang_scheduler.NAME, kueue.NAME) if addons else ()
    # kwok's nodes are for tests without a real node, or beside one (tainted) for the tests that want both; a plain
    # real-node cluster (`make demo`) has no use for them.
    with_kwok = addons or not real
    bins = {n: str(tool(n)) for n in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                                      *(("kwok",) if with_kwok else ()), *extra)}
    log("certificates", t0)
    make_pki(pki, extra_sans=(f"IP:{advertise}",) if real else ())
    for name in ("etcd", "etcd-peer", "apiserver", "kcm", "scheduler", "kwok", *extra[:1]):
        state.ports[name] = free_port()
    state.save()
    write_kubeconfig(state.kubeconfig, f"https://{host}:{state.ports['apiserver']}", pki)

    log("etcd", t0)
    etcd_url = f"http://127.0.0.1:{state.ports['etcd']}"
    etcd = _start(state, "etcd", [
        bins["etcd"], f"--data-dir={d / 'etcd-data'}", "--name=ddpjob-local",
        f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
        f"--listen-peer-urls=http://127.0.0.1:{state.ports['etcd-peer']}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{state.ports['etcd-peer']}",
        f"--initial-cluster=ddpjob-local=http://127.0.0.1:{state.ports['etcd-peer']}",
        # Test data is disposable: skipping fsync makes the apiserver several times faster on this disk.
        "--unsafe-no-fsync", "--quota-backend-bytes=4294967296", "--log-level=warn",
    ])
    _wait("etcd", etcd, lambda: _insecure_ok(f"{etcd_url}/health"), state)

    log("kube-apiserver", t0)
    api = _start(state, "kube-apiserver", [
        bins["kube-apiserver"], f"--etcd-servers={etcd_url}",
        f"--bind-address={bind}", f"--advertise-address={advertise}", f"--secure-port={state.ports['apiserver']}",
        f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki / 'sa.pub'}", f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}", "--authorization-mode=Node,RBAC",
        # On top of the defaults, what stricter clusters run (OpenShift's default): a blockOwnerDeletion
        # reference needs update on the owner's finalizers, so a chart without that right fails here too.
        "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
        "--allow-privileged=true", "--profiling=false", "--endpoint-reconciler-type=none",
        # logs/exec on the real node: the kubelet authenticates the apiserver by a cert from the cluster CA.
        # InternalIP first: the node's name is not in any DNS the apiserver uses.
        *([f"--kubelet-client-certificate={pki / 'admin.crt'}", f"--kubelet-client-key={pki / 'admin.key'}",
           "--kubelet-preferred-address-types=InternalIP,Hostname"] if real else []),
        # Enough headroom for the 500-job benchmark's burst of creates.
        "--max-requests-inflight=1000", "--max-mutating-requests-inflight=500",
        "--v=1",
        # Extra flags for measurements (bench/operator_scale.py turns on an audit log this way).
        *os.environ.get("DDPJOB_APISERVER_EXTRA_ARGS", "").split(),
    ])
    readyz = f"https://{host}:{state.ports['apiserver']}/readyz"
    _wait("kube-apiserver", api, lambda: _https_ok(readyz, pki), state, 90)

    log("kube-controller-manager, kube-scheduler" + (", scheduler-plugins (PodGroup CRD), Kueue" if addons
                                                     else " (no Kueue, no scheduler-plugins)"), t0)
    kubeconfig = str(state.kubeconfig)
    kueue_proc, gang = _start_addons(state, bins) if addons else (None, None)
    kcm = _start(state, "kube-controller-manager", [
        bins["kube-controller-manager"], f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1", f"--secure-port={state.ports['kcm']}", "--leader-elect=false",
        f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
        f"--cluster-signing-cert-file={pki / 'ca.crt'}", f"--cluster-signing-key-file={pki / 'ca.key'}",
        "--use-service-account-credentials=true", "--controllers=*",
        # In-tree dynamic provisioning for the default StorageClass below: PVCs bind without a CSI driver.
        "--enable-hostpath-provisioner=true",
        # Real nodes renew their lease every 2 s (hack/node/kubelet.yaml): a lost one is NotReady after 16 s, not 50.
        *(["--node-monitor-grace-period=16s", "--node-monitor-period=2s"] if real else []),
        f"--service-cluster-ip-range={SERVICE_CIDR}", "--kube-api-qps=200", "--kube-api-burst=400",
        "--v=1",
    ])
    sched = _start(state, "kube-scheduler", [
        bins["kube-scheduler"], f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1", f"--secure-port={state.ports['scheduler']}", "--leader-elect=false", "--v=1",
    ])
    kcm_health = f"https://127.0.0.1:{state.ports['kcm']}/healthz"
    _wait("kube-controller-manager", kcm, lambda: _insecure_ok(kcm_health), state)
    _wait("kube-scheduler", sched, lambda: _insecure_ok(f"https://127.0.0.1:{state.ports['scheduler']}/healthz"), state)
    if gang is not None:
        gang_health = f"https://127.0.0.1:{state.ports[gang_scheduler.NAME]}/healthz"
        _wait(gang_scheduler.NAME, gang, lambda: _insecure_ok(gang_health), state)
    if with_kwok:
        _start_kwok(state, bins["kwok"], t0)
        # Beside real nodes (now or joining later), untainted kwok nodes would take Deployments (the operator) and
        # the pods meant for real ones, and fake-run them.
        if real:
            _kubectl(state, "taint", "nodes", "-l", "type=kwok", "kwok.x-k8s.io/node=fake:NoSchedule", "--overwrite")
    _kubectl(state, "apply", "-f", "-", stdin=STORAGE_CLASS)

    def default_sa() -> bool:
        return bool(_kubectl(state, "get", "serviceaccount", "default", "-n", "default", "-o", "name").strip())

    _wait("kube-controller-manager", kcm, default_sa, state, 60)
    if kueue_proc is not None:
        kueue.wait_ready(state, kueue_proc)


def _alive(pid: int) -> bool:
    # Reap it if it is our own exited child (up and down in one process): a zombie still answers kill(pid, 0).
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def restart_apiserver(directory: Path) -> float:
    """Kill kube-apiserver and start it again with the same command line (every watch of every client breaks, as
    in an upgrade or a crash); returns the seconds it was unavailable. For tests of what watches miss."""
    state = ClusterState.load(directory.resolve())
    if state is None:
        raise RuntimeError(f"no cluster state in {directory}")
    pid = state.pids["kube-apiserver"]
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode().split("\0")
    t0 = time.monotonic()
    os.killpg(pid, signal.SIGKILL)  # a crash: a graceful stop drains for ~30 s, and crashes are what we test
    while _alive(pid):
        time.sleep(0.05)
    api = _start(state, "kube-apiserver", argv)
    url = f"https://{_server(state).split('://', 1)[1]}/readyz"
    _wait("kube-apiserver", api, lambda: _https_ok(url, Path(state.dir) / "pki"), state, 90)
    return time.monotonic() - t0


def down(directory: Path, *, quiet: bool = False, state: ClusterState | None = None) -> None:
    """Stop every process `up` started (by the PIDs it recorded) and remove the cluster's state."""
    directory = directory.resolve()
    if (directory / "node" / "state.json").exists():
        # A real node: its containers and processes first (the kubelet would restart what we kill); its bridge,
        # which holds the apiserver's address, and its other host changes only once the control plane is down.
        from tests.cluster import node

        node.stop(directory)
        try:
            _down(directory, quiet, state)
        finally:
            node.down(directory, quiet=quiet)
        return
    _down(directory, quiet, state)


def _down(directory: Path, quiet: bool, state: ClusterState | None) -> None:
    state = state or ClusterState.load(directory)
    if state is None:
        if not quiet:
            print(f"no cluster state in {directory}; nothing to stop", file=sys.stderr)
        return
    # Reverse start order: clients first, etcd last, so nothing logs a storm of connection errors.
    pids = list(reversed(state.pids.items()))
    for _, pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_alive(pid) for _, pid in pids):
        time.sleep(0.1)
    for name, pid in pids:
        if _alive(pid):
            print(f"{name} (pid {pid}) ignored SIGTERM; killing it", file=sys.stderr)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    # Reap our own children (when up and down run in one process, e.g. the pytest session fixture).
    for _, pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    for sub in ("etcd-data", "state.json"):
        path = directory / sub
        if path.is_dir():
            subprocess.run(["rm", "-rf", str(path)], check=False)
        elif path.exists():
            path.unlink()
    if not quiet:
        print(f"cluster in {directory} stopped ({len(pids)} processes)", file=sys.stderr)

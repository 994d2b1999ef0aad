"""An OCI registry for the local cluster (issue 44 #3): CNCF distribution's `registry` (built like the other tools,
hack/install-tools.sh), serving one storage directory twice:

- on the node bridge's address with TLS, its certificate from the cluster CA: what the real nodes' containerd pulls
  from (each node's `certs.d/<host:port>/hosts.toml` names the CA; hack/node/containerd.toml's `config_path`) and
  what `helm install oci://...` reads with `--ca-file`, as on a cluster whose registry has a private CA;
- on a loopback port without TLS: what `make push` (Docker) and `helm push` write to. Docker and Helm talk plain
  HTTP to 127.0.0.0/8 only, and trusting the cluster CA in the project's dockerd would mean a file under
  /etc/docker on the host. Only this process writes; the TLS one reads the blobs once they are complete."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.cluster.controlplane import free_port, tool
from tests.cluster.node import NODE_IP, NodeState
from tests.cluster.pki import serving_cert


def serve(root: Path, name: str, addr: str, tls: tuple[Path, Path] | None = None,
          delete: bool = False) -> subprocess.Popen[bytes]:
    """`registry serve` of ``root``/data on ``addr`` (TLS with the (cert, key) given), its config and log named
    ``name`` under ``root``; ``delete``: manifests and blobs may be deleted through the API."""
    http: dict[str, object] = {"addr": addr}
    if tls:
        http["tls"] = {"certificate": str(tls[0]), "key": str(tls[1])}
    storage: dict[str, object] = {"filesystem": {"rootdirectory": str(root / "data")}}
    if delete:
        storage["delete"] = {"enabled": True}
    config = root / f"{name}.yml"
    config.write_text(yaml.safe_dump({"version": 0.1, "log": {"level": "warn"}, "storage": storage, "http": http}))
    with open(root / f"{name}.log", "w") as log:
        return subprocess.Popen([str(tool("registry")), "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)


def answers(url: str, ca: Path | None = None) -> bool:
    """The registry at ``url`` (its /v2/) answers 200; ``ca``: the CA its TLS certificate is checked against."""
    context = ssl.create_default_context(cafile=str(ca)) if ca else None
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


@dataclass
class Registry:
    #: host:port the nodes pull from (TLS, cluster CA) and the chart is installed from.
    tls_host: str
    #: host:port that `make push` and `helm push` write to (plain HTTP, loopback).
    push_host: str
    ca: Path
    root: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @classmethod
    def start(cls, cluster_dir: Path, root: Path, timeout: float = 30.0) -> Registry:
        """Both registry processes, answering /v2/, and every real node of ``cluster_dir`` trusting the TLS one."""
        from tests.conftest import wait_for

        pki = cluster_dir / "pki"
        cert, key = serving_cert(pki, "registry", (f"IP:{NODE_IP}",))
        root.mkdir(parents=True, exist_ok=True)
        reg = cls(tls_host=f"{NODE_IP}:{free_port()}", push_host=f"127.0.0.1:{free_port()}", ca=pki / "ca.crt",
                  root=root)
        try:
            reg.procs += [serve(root, "tls", reg.tls_host, (cert, key)), serve(root, "push", reg.push_host)]
            wait_for(lambda: answers(f"https://{reg.tls_host}/v2/", reg.ca)
                     and answers(f"http://{reg.push_host}/v2/"), timeout=timeout,
                     describe="the registry answering /v2/ on both addresses", state=reg.logs)
            reg.trust_on_nodes(cluster_dir)
        except BaseException:
            reg.stop()
            raise
        return reg

    def trust_on_nodes(self, cluster_dir: Path) -> None:
        """containerd's hosts.toml for the TLS address on every real node: HTTPS with the cluster CA. containerd
        reads its hosts directory at each pull, so no restart."""
        ns = NodeState.load(cluster_dir.resolve())
        assert ns is not None, f"no real node in {cluster_dir}"
        for k in range(ns.nodes):
            d = hosts_dir(ns, k) / self.tls_host
            d.mkdir(parents=True, exist_ok=True)
            (d / "hosts.toml").write_text(
                f'server = "https://{self.tls_host}"\n\n[host."https://{self.tls_host}"]\n'
                f'  capabilities = ["pull", "resolve"]\n  ca = "{self.ca}"\n')

    def untrust_on_nodes(self, cluster_dir: Path) -> None:
        ns = NodeState.load(cluster_dir.resolve())
        if ns is None:  # the nodes are gone, and their hosts directories with them
            return
        for k in range(ns.nodes):
            shutil.rmtree(hosts_dir(ns, k) / self.tls_host, ignore_errors=True)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.root.glob("*.log")))

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()
        shutil.rmtree(self.root / "data", ignore_errors=True)


def hosts_dir(ns: NodeState, k: int) -> Path:
    """Node k's containerd registry hosts directory (hack/node/containerd.toml's `config_path`)."""
    return ns.dir_of(k) / "containerd" / "certs.d"

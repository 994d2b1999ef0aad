"""A real S3-compatible object store for the tests: SeaweedFS's ``weed mini`` (master, volume server, filer, S3
gateway and an admin server in one process; built by hack/install-tools.sh, version SEAWEEDFS_VERSION in
hack/versions.env) on free ports, with one S3 identity (so requests are signed and wrong credentials are refused) and
optional TLS. ``mini`` rather than ``server -filer -s3``: it takes writes after ~5.5 s instead of ~12 s (fixed waits
for volume-id allocation and filer membership) and stops on SIGTERM in under a second instead of more than ten.

    server = S3Server.start(tmp_path)                          # http://127.0.0.1:<port>
    server = S3Server.start(tmp_path, tls=(cert, key))         # https, a certificate from the caller's CA
    server = S3Server.start(tmp_path, host=pod_reachable_host())   # for pods on the real nodes (below)
    server.bucket("ckpt"); ...; server.stop()

Pods on the real nodes reach the host at the node-0 bridge address, 10.88.0.1 (tests/cluster/node.py NODE_IP): the
apiserver and CoreDNS bind there for the same reason, and pods on the network-namespace nodes reach it through the
host's routes (docs/real-node.md). It exists only while a real-node cluster is up; loopback is never reachable from
a pod. The certificate for it needs ``IP:10.88.0.1`` among its SANs (tests/cluster/pki.py ``serving_cert``).

``stop`` ends the whole process group and removes the data directory, and any Unix socket weed left in /tmp (it puts
``/tmp/seaweedfs-<service>-grpc-<port>.sock`` there whatever TMPDIR says, and removes them itself on SIGTERM)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.cluster.controlplane import free_port, versions

SERVICES = ("master", "volume", "filer", "s3", "admin")


def weed_binary() -> Path:
    """Where hack/install-tools.sh puts weed (it may not be built: the caller decides to skip or build)."""
    version = versions()["SEAWEEDFS_VERSION"]
    cache = Path(os.environ.get("DDPJOB_CACHE", Path.home() / ".cache" / "ddpjob"))
    return cache / "bin" / f"weed-{version}" / "weed"


def pod_reachable_host() -> str:
    """The host address that pods on the local real nodes can connect to (see the module's docstring)."""
    from tests.cluster.node import NODE_IP

    return NODE_IP


@dataclass
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str
    #: The log (weed's stderr), kept after stop for a failure's report.
    log: Path
    region: str = "us-east-1"
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _data: Path | None = field(default=None, repr=False)
    _grpc_ports: dict[str, int] = field(default_factory=dict, repr=False)
    _ca: str | None = field(default=None, repr=False)

    @classmethod
    def start(cls, directory: Path, host: str = "127.0.0.1", tls: tuple[Path, Path] | None = None,
              ca: Path | None = None, timeout: float = 90.0, outlive_bridge: bool = False) -> S3Server:
        """Start weed and return once an authenticated S3 request succeeds. ``tls``: (certificate, key) the server
        presents; ``ca``: the bundle this fixture's own client trusts (for ``bucket``), needed with ``tls``.
        ``outlive_bridge``: serve on every address (its parts talk over loopback) while the endpoint names ``host``,
        so the store outlives the real-node cluster that holds ``host`` and serves the next one that brings it back
        (tests/e2e/test_multikueue.py)."""
        binary = weed_binary()
        if not binary.exists():
            raise FileNotFoundError(f"{binary} is not built: run hack/install-tools.sh")
        ip, bind = ("127.0.0.1", "0.0.0.0") if outlive_bridge else (host, host)
        with socket.socket() as s:  # a clear error instead of weed's own when the address is not ours (yet)
            try:
                s.bind((bind, 0))
            except OSError as e:
                raise RuntimeError(f"cannot bind {host} ({e}): for {pod_reachable_host()}, start a real-node "
                                   f"cluster first (make cluster-up NODE=real)") from None
        directory.mkdir(parents=True, exist_ok=True)
        data = Path(tempfile.mkdtemp(prefix="seaweedfs-", dir=directory))
        ports = {name: free_port() for name in SERVICES}
        grpc = {name: free_port() for name in SERVICES}
        access_key, secret_key = f"ddpjob-{secrets.token_hex(6)}", secrets.token_urlsafe(30)
        identities = {"identities": [{"name": "ddpjob", "credentials": [{"accessKey": access_key,
                                                                          "secretKey": secret_key}],
                                      "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}
        (data / "s3.json").write_text(json.dumps(identities))
        for sub in ("volume", "master"):
            (data / sub).mkdir()
        # No telemetry, WebDAV, admin UI, Iceberg or Lance endpoint, legacy admin port; no wait before a stop. The admin
        # server itself (and its maintenance worker) always runs, on loopback whatever the host.
        argv = [str(binary), "-logtostderr=true", "-v=0", "mini", f"-ip={ip}", f"-ip.bind={bind}",
                f"-dir={data / 'volume'}", f"-master.dir={data / 'master'}", "-master.telemetry=false",
                "-webdav=false", "-admin.ui=false", "-admin.port.legacy=0", "-s3.port.iceberg=0", "-s3.port.lance=0",
                "-volume.preStopSeconds=0", f"-s3.config={data / 's3.json'}",
                f"-filer.localSocket={data / 'filer.sock'}", f"-s3.localSocket={data / 's3.sock'}"]
        for name in SERVICES:
            argv += [f"-{name}.port={ports[name]}", f"-{name}.port.grpc={grpc[name]}"]
        if tls:
            argv += [f"-s3.cert.file={tls[0]}", f"-s3.key.file={tls[1]}"]
        log = directory / f"weed-{ports['s3']}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, cwd=data, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env={**os.environ, "TMPDIR": str(data)})
        scheme = "https" if tls else "http"
        server = cls(endpoint=f"{scheme}://{host}:{ports['s3']}", access_key=access_key, secret_key=secret_key,
                     log=log, _proc=proc, _data=data, _grpc_ports=grpc, _ca=str(ca) if ca else None)
        try:
            server._wait_ready(timeout)
        except BaseException:
            server.stop()
            raise
        return server

    def client(self, **overrides: Any) -> Any:
        """A plain boto3 S3 client for this server (tests' own checks, bucket creation)."""
        import boto3
        from botocore.config import Config

        kwargs: dict[str, Any] = {
            "endpoint_url": self.endpoint, "aws_access_key_id": self.access_key,
            "aws_secret_access_key": self.secret_key, "region_name": self.region, "verify": self._ca or True,
            "config": Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}, connect_timeout=5,
                             read_timeout=30),
        }
        return boto3.client("s3", **(kwargs | overrides))

    def _wait_ready(self, timeout: float) -> None:
        """Until a bucket can be created, written, read and removed: the S3 port opens before the filer and the
        volume server have registered with the master, and a write before that fails."""
        deadline = time.monotonic() + timeout
        client, last = self.client(), "no answer yet"
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                raise RuntimeError(f"weed exited ({self._proc and self._proc.returncode}):\n{self.tail()}")
            try:
                client.create_bucket(Bucket="ddpjob-ready")
                client.put_object(Bucket="ddpjob-ready", Key="probe", Body=b"ok")
                assert client.get_object(Bucket="ddpjob-ready", Key="probe")["Body"].read() == b"ok"
                client.delete_object(Bucket="ddpjob-ready", Key="probe")
                client.delete_bucket(Bucket="ddpjob-ready")
                return
            except Exception as e:
                last = f"{type(e).__name__}: {e}"
                time.sleep(0.2)
        raise TimeoutError(f"weed's S3 at {self.endpoint} not ready after {timeout:.0f} s ({last}):\n{self.tail()}")

    def bucket(self, name: str) -> str:
        """Create a bucket (an existing one of ours is fine) and return its name."""
        client = self.client()
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=name)
        return name

    def tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self) -> None:
        """SIGTERM to the process group (weed removes its sockets and exits in under a second), SIGKILL after 10 s;
        then the data directory and any socket weed left in /tmp. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            with contextlib.suppress(ProcessLookupError):  # anything left in the group (weed forks nothing today)
                os.killpg(proc.pid, signal.SIGKILL)
        for name, port in self._grpc_ports.items():
            with contextlib.suppress(FileNotFoundError):
                Path(f"/tmp/seaweedfs-{name}-grpc-{port}.sock").unlink()
        if self._data is not None:
            shutil.rmtree(self._data, ignore_errors=True)
            self._data = None

    def __enter__(self) -> S3Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

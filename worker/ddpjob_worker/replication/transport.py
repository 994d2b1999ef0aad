"""How the pods of a job exchange checkpoint files: a small HTTP server in every pod's agent and the client calls
that talk to it, over the job's own network (the job's NetworkPolicy admits only its pods), standard library only.

Endpoints (every request carries the job's UID in ``X-DDPJob-Job``; another job's pod, or a stale address now
given to another pod, is refused):
- ``GET /v1/inventory``: what the pod holds and the deletions it knows (ledger.Entry as JSON), its name and volume;
- ``POST /v1/announce``: a peer's new versions, so this pod fetches them at once rather than at the next poll;
- ``GET /v1/file?path=P&version=V&origin=O``: that exact version of a file (409 if the pod holds another one),
  sent with sendfile; ``X-Sha256`` carries its digest so the receiver checks what it got.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO, Protocol
from urllib.parse import parse_qs, quote, urlparse

from ddpjob_worker.logs import get_logger
from ddpjob_worker.replication.ledger import Entry

log = get_logger("replication")

JOB_HEADER = "X-DDPJob-Job"
SHA_HEADER = "X-Sha256"
#: Files one pod sends at once; a further request gets 503 and the asker tries another holder, so a new checkpoint
#: spreads from the peers that already have it instead of all from its writer.
MAX_SENDS = 2
CHUNK = 4 << 20


class TransferError(Exception):
    """A request to a peer failed: refused, unreachable, or the bytes did not match."""


class Source(Protocol):
    """What the server asks of the replicator."""

    def inventory(self) -> dict[str, Any]: ...

    def announced(self, data: Mapping[str, Any]) -> None: ...

    def open_version(self, path: str, version: int, origin: str) -> tuple[BinaryIO, int, str] | None: ...


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request would drown the agent's log; failures are logged by the replicator

    def _refuse(self, code: int, why: str) -> None:
        body = why.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _allowed(self) -> bool:
        if self.headers.get(JOB_HEADER) != self.server.job:
            self._refuse(403, "not a pod of this job")
            return False
        return True

    def do_GET(self) -> None:
        if not self._allowed():
            return
        url = urlparse(self.path)
        if url.path == "/v1/inventory":
            self._json(self.server.source.inventory())
        elif url.path == "/v1/file":
            q = {k: v[0] for k, v in parse_qs(url.query).items()}
            self._send_file(q.get("path", ""), int(q.get("version", "0")), q.get("origin", ""))
        else:
            self._refuse(404, "no such endpoint")

    def do_POST(self) -> None:
        if not self._allowed():
            return
        length = int(self.headers.get("Content-Length") or 0)
        data = json.loads(self.rfile.read(length) or b"{}")
        self.server.source.announced(data)
        self.send_response(204)
        self.end_headers()

    def _json(self, data: Any) -> None:
        body = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_file(self, path: str, version: int, origin: str) -> None:
        if not self.server.sends.acquire(blocking=False):
            self._refuse(503, "busy: ask another holder")
            return
        try:
            opened = self.server.source.open_version(path, version, origin)
            if opened is None:
                self._refuse(409, "this pod does not hold that version")
                return
            f, size, sha = opened
            with f:
                self.send_response(200)
                self.send_header("Content-Length", str(size))
                self.send_header(SHA_HEADER, sha)
                self.end_headers()
                self.wfile.flush()
                self.connection.sendfile(f, 0, size)
        finally:
            self.server.sends.release()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], source: Source, job: str) -> None:
        super().__init__(address, _Handler)
        self.source = source
        self.job = job
        self.sends = threading.BoundedSemaphore(MAX_SENDS)


def serve(source: Source, job: str, host: str, port: int) -> tuple[ThreadingHTTPServer, int]:
    """Start the server on a daemon thread; returns it and the port it listens on."""
    server = _Server((host, port), source, job)
    threading.Thread(target=server.serve_forever, name="ddpjob-replica-server", daemon=True).start()
    return server, server.server_address[1]


def _connection(address: str, timeout: float) -> http.client.HTTPConnection:
    host, _, port = address.rpartition(":")
    return http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout)


def request_json(address: str, job: str, method: str, path: str, body: Any = None,
                 timeout: float = 5.0) -> Any:
    """One JSON request to a peer; TransferError on any failure."""
    conn = _connection(address, timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={JOB_HEADER: job, "Content-Type": "application/json"})
        resp = conn.getresponse()
        payload = resp.read()
        if resp.status >= 300:
            raise TransferError(f"{method} {path} on {address}: HTTP {resp.status} {payload[:200]!r}")
        return json.loads(payload) if payload else None
    except (OSError, http.client.HTTPException, ValueError) as err:
        raise TransferError(f"{method} {path} on {address}: {type(err).__name__}: {err}") from err
    finally:
        conn.close()


def fetch(address: str, job: str, entry: Entry, dest: Path, timeout: float = 30.0,
          progress: Callable[[int], None] | None = None) -> None:
    """Download exactly ``entry`` from ``address`` into ``dest`` (a staging name the caller renames), fsynced;
    TransferError when the peer refuses, the bytes stop coming for ``timeout`` s, or size or digest differ."""
    query = f"/v1/file?path={quote(entry.path)}&version={entry.version}&origin={quote(entry.origin)}"
    conn = _connection(address, timeout)
    try:
        conn.request("GET", query, headers={JOB_HEADER: job})
        resp = conn.getresponse()
        if resp.status != 200:
            raise TransferError(f"{entry.path} v{entry.version} from {address}: HTTP {resp.status} "
                                f"{resp.read()[:200]!r}")
        digest, got = hashlib.sha256(), 0
        with open(dest, "wb") as out:
            while chunk := resp.read(CHUNK):
                digest.update(chunk)
                out.write(chunk)
                got += len(chunk)
                if progress is not None:
                    progress(len(chunk))
            out.flush()
            os.fsync(out.fileno())
        if got != entry.size or digest.hexdigest() != (resp.getheader(SHA_HEADER) or entry.sha256):
            raise TransferError(f"{entry.path} v{entry.version} from {address}: got {got} bytes, sha256 "
                                f"{digest.hexdigest()[:12]}, expected {entry.size} bytes, {entry.sha256[:12]}")
    except (OSError, http.client.HTTPException) as err:
        with contextlib.suppress(OSError):
            dest.unlink()
        raise TransferError(f"{entry.path} from {address}: {type(err).__name__}: {err}") from err
    except TransferError:
        with contextlib.suppress(OSError):
            dest.unlink()
        raise
    finally:
        conn.close()

"""The Lease's I/O for leader.py: an aiohttp session of its own, from the same credentials kopf uses, because kopf's
client starts only after the Lease is held; the holder identity and the Lease's namespace; and a /healthz for a
standby, which runs no kopf and so would otherwise fail its liveness probe."""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp
import kopf
from aiohttp import web

from ddpjob_operator.kube.leader import Obj

LEASES = "apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
#: The in-cluster namespace file: a replica's own namespace is where its Lease lives.
NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def identity() -> str:
    """This process's holder identity: the pod's name, plus a suffix that tells a restarted container apart."""
    return f"{os.environ.get('HOSTNAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def default_namespace() -> str:
    """The namespace the operator runs in (in a pod), else ``default``."""
    try:
        with open(NAMESPACE_FILE, encoding="utf-8") as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


def login() -> kopf.ConnectionInfo:
    """The credentials kopf's own login (handlers.login) would use: in-cluster first, else the kubeconfig."""
    settings = kopf.OperatorSettings()
    info = kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(settings=settings)
    if info is None:
        raise RuntimeError("no Kubernetes credentials: neither in-cluster nor a kubeconfig")
    return info


class HttpLeases:
    """One Lease (``namespace``/``name``) over HTTP: get, create, and replace conditional on resourceVersion."""

    def __init__(self, namespace: str, name: str, credentials: Callable[[], kopf.ConnectionInfo] = login) -> None:
        self.namespace, self.name, self.credentials = namespace, name, credentials
        self._session: aiohttp.ClientSession | None = None
        self._server = ""

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            info = self.credentials()
            self._server = info.server.rstrip("/")
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=info.as_ssl_context()), headers=info.as_http_headers(),
                auth=info.as_aiohttp_basic_auth(), timeout=aiohttp.ClientTimeout(total=10))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _request(self, method: str, path: str, body: Obj | None = None) -> tuple[int, Obj]:
        session = self._open()
        url = f"{self._server}/{LEASES.format(ns=self.namespace)}{path}"
        async with session.request(method, url, json=body) as response:
            text = await response.text()
        if response.status == 401:  # a rotated token: log in again at the next try
            await self.close()
        if response.status >= 400 and response.status not in (404, 409):
            raise RuntimeError(f"{method} {url}: {response.status} {text[:300]}")
        return response.status, (json.loads(text) if text else {})

    async def get(self) -> Obj | None:
        status, lease = await self._request("GET", f"/{self.name}")
        return None if status == 404 else lease

    async def create(self, spec: Obj) -> Obj | None:
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace}, "spec": spec}
        status, lease = await self._request("POST", "", body)
        return None if status == 409 else lease

    async def replace(self, lease: Obj, spec: Obj) -> Obj | None:
        body: dict[str, Any] = {**lease, "spec": spec}
        status, updated = await self._request("PUT", f"/{self.name}", body)
        return None if status in (404, 409) else updated


async def standby_health(port: int) -> web.AppRunner | None:
    """Serve /healthz on ``port`` while this replica waits for the Lease (kopf serves it once leading)."""
    if not port:
        return None
    app = web.Application()

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="standby: waiting for the leader lease\n")

    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", port).start()
    return runner

"""A proxy in front of the test control plane for the operator under test (issue 23 #2): every resourceVersion it
passes on is opaque (``rv-`` and scrambled hex: not a number, and its string order is not the numbers' order),
translated back on the way in, so code that parses or orders resourceVersions breaks as it would on an API server
that does not hand out integers. It can also hold back the LISTs of one namespace (the namespaced resync race), and
hold one status write of a DDPJob in flight until the test lets it go (an old leader's write that lands late, issue
43 #5: ``hold_status_write``); ``scramble=False`` passes resourceVersions on as they are.

It speaks plain HTTP to the operator (a kubeconfig of its own, no credentials) and HTTPS with the admin client
certificate to the API server; watches are passed on line by line."""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

MASK = 0x5BD1E995
_HOP = {"content-length", "transfer-encoding", "content-encoding", "connection", "keep-alive", "host"}


def opaque(rv: str) -> str:
    return f"rv-{int(rv) ^ MASK:x}" if rv.isdigit() else rv


def plain(rv: str) -> str:
    return str(int(rv[3:], 16) ^ MASK) if rv.startswith("rv-") else rv


def _convert(obj: Any, how: Any) -> Any:
    """Every metadata.resourceVersion in ``obj`` (objects, lists, watch events), converted by ``how``."""
    if isinstance(obj, dict):
        meta = obj.get("metadata")
        if isinstance(meta, dict) and isinstance(meta.get("resourceVersion"), str):
            meta["resourceVersion"] = how(meta["resourceVersion"])
        for value in obj.values():
            _convert(value, how)
    elif isinstance(obj, list):
        for value in obj:
            _convert(value, how)
    return obj


class OpaqueProxy:
    """Run with ``start()``/``stop()``; ``kubeconfig`` points a client at it. ``hold(namespace, seconds)``: LISTs of
    pods in that namespace wait that long first, and ``held`` is set when one starts waiting."""

    def __init__(self, kubeconfig: Path, directory: Path, scramble: bool = True) -> None:
        self._to_client: Callable[[str], str] = opaque if scramble else str
        self._to_server: Callable[[str], str] = plain if scramble else str
        self.write_held = threading.Event()
        self.write_answer: int | None = None
        self.write_body: Any = None
        self._write_hold: str | None = None
        self._write_gate = asyncio.Event()
        cfg = yaml.safe_load(kubeconfig.read_text())
        cluster, user = cfg["clusters"][0]["cluster"], cfg["users"][0]["user"]
        self.server = cluster["server"].rstrip("/")
        self._ssl = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self._ssl.load_cert_chain(user["client-certificate"], user["client-key"])
        self.kubeconfig = directory / "opaque-kubeconfig"
        self.held = threading.Event()
        self.requests = 0
        self._hold: tuple[str, float] | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    def hold(self, namespace: str, seconds: float) -> None:
        self.held.clear()
        self._hold = (namespace, seconds)

    def release(self) -> None:
        self._hold = None

    def hold_status_write(self, job: str) -> None:
        """Hold the next PATCH of DDPJob ``job``'s status before it reaches the API server (``write_held`` is set)
        until :meth:`let_write_go`; ``write_answer`` is then the API server's status code for it."""
        self.write_held.clear()
        self.write_answer = None
        self._loop.call_soon_threadsafe(self._write_gate.clear)
        self._write_hold = f"/ddpjobs/{job}/status"

    def let_write_go(self) -> None:
        self._loop.call_soon_threadsafe(self._write_gate.set)

    def start(self) -> None:
        self._thread.start()
        port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "opaque",
            "clusters": [{"name": "opaque", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
            "users": [{"name": "anyone", "user": {}}],
            "contexts": [{"name": "opaque", "context": {"cluster": "opaque", "user": "anyone"}}]}))

    async def _start(self) -> int:
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self._ssl),
                                              timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]

    def stop(self) -> None:
        async def _stop() -> None:
            if self._session is not None:  # first: ends the watches' upstream reads, which hold their handlers
                await self._session.close()
            if self._runner is not None:
                await self._runner.cleanup()
        asyncio.run_coroutine_threadsafe(_stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        query = {k: self._to_server(v) if k == "resourceVersion" else v for k, v in request.query.items()}
        watch = query.get("watch") in ("true", "1")
        await self._maybe_hold(request, watch)
        body = await request.read()
        held = await self._maybe_hold_write(request, body)
        if body and request.content_type.endswith("json"):
            body = json.dumps(_convert(json.loads(body), self._to_server)).encode()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        assert self._session is not None
        async with self._session.request(request.method, self.server + request.path, params=query, data=body or None,
                                         headers=headers) as upstream:
            out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP}
            if watch and upstream.status == 200:
                response = web.StreamResponse(status=upstream.status, headers=out_headers)
                await response.prepare(request)
                try:
                    async for line in upstream.content:
                        if line.strip():
                            line = json.dumps(_convert(json.loads(line), self._to_client)).encode() + b"\n"
                        await response.write(line)
                except (aiohttp.ClientError, ConnectionError):
                    pass  # the client went, or the proxy stops: the watch ends as a dropped connection would
                return response
            data = await upstream.read()
            if held:
                self.write_answer = upstream.status
            if data and "json" in upstream.headers.get("Content-Type", ""):
                data = json.dumps(_convert(json.loads(data), self._to_client)).encode()
            return web.Response(status=upstream.status, body=data, headers=out_headers)

    async def _maybe_hold_write(self, request: web.Request, body: bytes) -> bool:
        hold = self._write_hold
        if hold is None or request.method != "PATCH" or not request.path.endswith(hold):
            return False
        self._write_hold = None  # only the first one
        self.write_body = json.loads(body)
        self.write_held.set()
        await self._write_gate.wait()
        return True

    async def _maybe_hold(self, request: web.Request, watch: bool) -> None:
        hold = self._hold
        if hold is None or watch or request.method != "GET" or not request.path.endswith(
                f"/namespaces/{hold[0]}/pods"):
            return
        self.held.set()
        await asyncio.sleep(hold[1])

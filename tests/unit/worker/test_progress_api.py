"""The progress reporter's own API client (ddpjob_worker.statusclient.InClusterApi), against a local HTTPS server with a
certificate from a local CA: the request the API server gets, the rotated token, refusals and a server that hangs."""

from __future__ import annotations

import json
import logging
import shutil
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from ddpjob_worker import contract, progress, statusclient
from ddpjob_worker.progress import ApiError, InClusterApi, ProgressReporter

ENV = {contract.DDPJOB_NAME: "charlm", contract.DDPJOB_NAMESPACE: "ml", contract.DDPJOB_REPORT_PROGRESS: "1",
       "RANK": "0"}
STATUS_PATH = "/apis/ddpjob.io/v1alpha1/namespaces/ml/ddpjobs/charlm/status"

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI for a certificate")


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class FakeApiServer:
    """What the API server was sent, and how it answers: ``status`` with a Kubernetes Status body, or nothing at all
    until ``release`` is set when ``hang``."""

    port: int = 0
    requests: list[Request] = field(default_factory=list)
    status: int = 200
    hang: bool = False
    release: threading.Event = field(default_factory=threading.Event)
    stored_status: dict[str, Any] = field(default_factory=dict)
    """The DDPJob's status in a 200 answer (the object as stored)."""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA and a serving certificate for 127.0.0.1 signed by it (the local control plane's PKI helper)."""
    from tests.cluster.pki import make_pki

    directory = tmp_path_factory.mktemp("pki")
    make_pki(directory)
    return directory


@pytest.fixture
def service_account(pki: Path, tmp_path: Path) -> Path:
    """The directory Kubernetes mounts at /var/run/secrets/kubernetes.io/serviceaccount."""
    directory = tmp_path / "serviceaccount"
    directory.mkdir()
    (directory / "token").write_text("token-1\n")
    shutil.copy(pki / "ca.crt", directory / "ca.crt")
    return directory


@pytest.fixture
def server(pki: Path) -> Iterator[FakeApiServer]:
    fake = FakeApiServer()

    class Handler(BaseHTTPRequestHandler):
        def do_PATCH(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            fake.requests.append(Request(self.command, self.path, dict(self.headers.items()), body))
            if fake.hang:
                fake.release.wait(30)
                return
            answer = {"kind": "DDPJob", "status": fake.stored_status} if fake.status == 200 else {
                "kind": "Status", "status": "Failure", "reason": "Forbidden", "code": fake.status,
                "message": 'ddpjobs.ddpjob.io "charlm" is forbidden: User "system:serviceaccount:ml:default" cannot '
                           'patch resource "ddpjobs/status"'}
            data = json.dumps(answer).encode()
            self.send_response(fake.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(pki / "apiserver.crt", pki / "apiserver.key")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
    fake.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.release.set()
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def warnings_seen(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    logger = logging.getLogger("ddpjob")
    logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)


@pytest.fixture(autouse=True)
def no_script_report() -> Iterator[None]:
    """Creating a ProgressReporter marks this process as reporting its own progress; not beyond the test."""
    yield
    progress._script_reports.clear()


def api_for(server: FakeApiServer, service_account: Path) -> InClusterApi:
    environ = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(server.port)}
    return InClusterApi.from_environ(environ, service_account)


def test_the_reporter_merge_patches_status_with_the_service_account_token(
        server: FakeApiServer, service_account: Path) -> None:
    reporter = ProgressReporter(environ=ENV, api=api_for(server, service_account), interval_seconds=3600)
    reporter.report(epoch=1, step=4, global_step=14, loss=1.25, checkpoint_step=10, checkpoint_time=0)
    assert reporter.drain(5)
    [request] = server.requests
    assert (request.method, request.path) == ("PATCH", STATUS_PATH)
    assert request.headers["Authorization"] == "Bearer token-1"
    assert request.headers["Content-Type"] == "application/merge-patch+json"
    assert request.headers["Accept"] == "application/json"
    sent = request.body["status"]["progress"]
    assert list(request.body) == ["status"] and list(request.body["status"]) == ["progress"]
    assert {k: sent[k] for k in ("epoch", "step", "globalStep", "loss", "lastCheckpoint", "source")} == {
        "epoch": 1, "step": 4, "globalStep": 14, "loss": 1.25,
        "lastCheckpoint": {"step": 10, "time": "1970-01-01T00:00:00Z"}, "source": progress.SOURCE_REPORTER}


def test_a_rotated_token_is_used_from_the_next_patch_on(server: FakeApiServer, service_account: Path) -> None:
    reporter = ProgressReporter(environ=ENV, api=api_for(server, service_account), interval_seconds=3600)
    reporter.report(epoch=0, step=1, global_step=1)
    assert reporter.drain(5)
    (service_account / "token").write_text("token-2")  # the kubelet refreshes bound tokens (hourly by default)
    reporter.report(epoch=0, step=2, global_step=2, force=True)
    assert reporter.drain(5)
    assert [r.headers["Authorization"] for r in server.requests] == ["Bearer token-1", "Bearer token-2"]


def test_in_cluster_configuration_comes_from_the_pods_environment_and_service_account(
        server: FakeApiServer, service_account: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(server.port))
    monkeypatch.setattr(statusclient, "SERVICE_ACCOUNT_DIR", service_account)
    reporter = ProgressReporter(environ=ENV)
    reporter.report(epoch=0, step=1, global_step=1)
    assert reporter.drain(5)
    assert [(r.path, r.body["status"]["progress"]["globalStep"]) for r in server.requests] == [(STATUS_PATH, 1)]


def test_a_refusal_is_logged_once_with_the_servers_reason_and_training_goes_on(
        server: FakeApiServer, service_account: Path, warnings_seen: pytest.LogCaptureFixture) -> None:
    server.status = 403
    reporter = ProgressReporter(environ=ENV, api=api_for(server, service_account), interval_seconds=0)
    for i in range(3):
        reporter.report(epoch=0, step=i, global_step=i)
        assert reporter.drain(5)
    assert len(server.requests) == 3  # still trying: RBAC may be fixed while the job runs
    assert warnings_seen.text.count("cannot patch ddpjobs/charlm status in ml") == 1
    assert '403 Forbidden: ddpjobs.ddpjob.io "charlm" is forbidden' in warnings_seen.text


def test_a_server_that_never_answers_slows_no_training_step_and_is_timed_out(
        server: FakeApiServer, service_account: Path, monkeypatch: pytest.MonkeyPatch,
        warnings_seen: pytest.LogCaptureFixture) -> None:
    server.hang = True
    monkeypatch.setattr(statusclient, "REQUEST_TIMEOUT_SECONDS", 0.5)
    reporter = ProgressReporter(environ=ENV, api=api_for(server, service_account), interval_seconds=0)
    t0 = time.monotonic()
    for step in range(1, 51):  # 50 training steps, each reporting, while the server holds every request
        reporter.report(epoch=0, step=step, global_step=step)
    took = time.monotonic() - t0
    assert took < 0.25, f"50 reports took {took:.2f}s: the training thread waited for the API server"
    assert reporter.drain(5)  # in the sender's thread each request gives up after the timeout
    assert 1 <= len(server.requests) <= 3, len(server.requests)  # merged: the latest, never a backlog of 50
    assert server.requests[-1].body["status"]["progress"]["globalStep"] == 50
    assert "timed out" in warnings_seen.text


def test_a_listener_that_never_completes_the_tls_handshake_is_timed_out_too(service_account: Path) -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as listener:  # accepted by the kernel, never spoken to
        api = InClusterApi("127.0.0.1", listener.getsockname()[1], service_account / "token",
                           service_account / "ca.crt")
        t0 = time.monotonic()
        with pytest.raises(ApiError, match="timed out"):
            api.patch_namespaced_custom_object_status("ddpjob.io", "v1alpha1", "ml", "ddpjobs", "charlm", {},
                                                      _request_timeout=0.5)
        assert time.monotonic() - t0 < 3


def test_outside_a_cluster_the_reporter_says_so_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     warnings_seen: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ApiError, match="not in a cluster"):
        InClusterApi.from_environ({})
    with pytest.raises(ApiError, match="no service account token"):
        InClusterApi.from_environ({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"},
                                  tmp_path)
    reporter = ProgressReporter(environ=ENV, interval_seconds=0)
    reporter.report(epoch=0, step=1, global_step=1)
    reporter.report(epoch=0, step=2, global_step=2)
    assert reporter.drain(5)
    assert warnings_seen.text.count("not in a cluster") == 1


def test_the_operators_cadence_in_the_answer_spaces_the_routine_reports_and_a_failure_backs_off(
        server: FakeApiServer, service_account: Path) -> None:
    """Issue 46: status.reportIntervalSeconds (the operator's write budget) in the answer to a report is the least
    time before the next routine one; a failed report doubles it (up to MAX_BACKOFF times); forced reports go."""
    server.stored_status = {contract.STATUS_REPORT_INTERVAL: 80}
    reporter = ProgressReporter(environ=ENV, api=api_for(server, service_account), interval_seconds=10)
    reporter.report(epoch=0, step=1, global_step=1)
    assert reporter.drain(5) and reporter.interval_now() == 80
    assert reporter.interval_now(base=120) == 120  # a caller's own longer interval wins
    reporter._last_sent -= 30  # 30 s later: due at the worker's 10 s, not at the operator's 80 s
    reporter.report(epoch=0, step=2, global_step=2)
    assert reporter.drain(5) and len(server.requests) == 1
    server.status = 503
    reporter.report(epoch=0, step=3, global_step=3, force=True)
    assert reporter.drain(5) and len(server.requests) == 2
    assert reporter.interval_now() == 160
    for _ in range(3):
        reporter.report(epoch=0, step=3, global_step=3, force=True)
        assert reporter.drain(5)
    assert reporter.interval_now() == 80 * progress.MAX_BACKOFF
    server.status, server.stored_status = 200, {}
    reporter.report(epoch=0, step=4, global_step=4, force=True)
    assert reporter.drain(5) and reporter.interval_now() == 20  # a quick answer halves the backoff; no cadence now
    reporter.report(epoch=0, step=5, global_step=5, force=True)
    assert reporter.drain(5) and reporter.interval_now() == 10  # the worker's own


def test_a_slow_answer_backs_off_like_a_failure(server: FakeApiServer, service_account: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy API server answers late before it fails: every reporter that sees it sends less."""
    monkeypatch.setattr(progress, "SLOW_SECONDS", 0.0)  # every answer is slow
    reporter = ProgressReporter(environ=ENV, api=api_for(server, service_account), interval_seconds=10)
    for step in range(3):
        reporter.report(epoch=0, step=step, global_step=step, force=True)
        assert reporter.drain(5)
    assert reporter.interval_now() == 10 * progress.MAX_BACKOFF

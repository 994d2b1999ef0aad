"""Rank 0's progress reporter: epoch, step, loss and the last checkpoint into the DDPJob's ``status.progress``
(so ``kubectl get ddpjobs`` shows them) and, under ``ddpjob run``, into a local JSON file. A script that does not
use it still reports its steps: the recorded runner counts them (ddpjob_worker.autoprogress) and sends them
through the same path, unless the script creates a reporter of its own.

The status patch goes over HTTPS with the standard library only (InClusterApi), not the ``kubernetes`` client: the
runtime is injected into users' own images, which have Python and torch and nothing else."""

from __future__ import annotations

import http.client
import json
import math
import os
import ssl
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

from ddpjob_worker import contract
from ddpjob_worker.logs import get_logger
from ddpjob_worker.sender import Sender

log = get_logger("progress")

GROUP, VERSION, PLURAL = "ddpjob.io", "v1alpha1", "ddpjobs"
#: ``status.progress.source``: the script's own ProgressReporter, or the optimizer steps the runtime counted.
SOURCE_REPORTER = "Reporter"
SOURCE_OPTIMIZER = "OptimizerSteps"
#: Seconds one status patch may take: a hung API server must not hold a report (or the exit that flushes it).
REQUEST_TIMEOUT_SECONDS = 10
#: Where Kubernetes mounts the pod's service account: ``token`` (a bound token the kubelet rotates, hourly by
#: default), ``ca.crt`` (the cluster CA that signed the API server's certificate).
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MERGE_PATCH = "application/merge-patch+json"

# Set once the script in this process creates a ProgressReporter: its richer report then owns status.progress, and
# the runtime's step counter sends nothing, so no step is ever reported twice. At creation, not at the first
# report: a script may sleep or checkpoint between its first optimizer step and its first report, and the counter's
# report in between would carry a start record without the script's checkpoint-loaded time.
_script_reports = threading.Event()


def script_reports() -> bool:
    """Whether the script in this process reports its own progress (it created a ProgressReporter)."""
    return _script_reports.is_set()


def rfc3339(ts: float | None = None) -> str:
    """UTC time as Kubernetes writes it."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if ts is None else ts))


def rfc3339_ms(ts: float) -> str:
    """UTC time with milliseconds (RFC 3339; the recovery clock needs better than Kubernetes' seconds)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts * 1000) % 1000:03d}Z"


class StatusApi(Protocol):
    """What the reporter needs of an API client: the ``kubernetes`` client's CustomObjectsApi method of that name, so
    that client (or a test's fake) can stand in for InClusterApi."""

    def patch_namespaced_custom_object_status(self, group: str, version: str, namespace: str, plural: str,
                                              name: str, body: Any, **kwargs: Any) -> Any: ...


class ApiError(Exception):
    """The status patch failed: no in-cluster configuration, or the API server refused or did not answer."""


class InClusterApi:
    """The one call the reporter makes, with the standard library: an HTTPS merge patch of a custom object's status,
    authenticated as the pod's service account (in-cluster configuration, as the ``kubernetes`` client's
    ``load_incluster_config`` reads it)."""

    def __init__(self, host: str, port: int, token_file: Path, ca_file: Path) -> None:
        self.host, self.port, self.token_file = host, port, token_file
        # Loaded once, like the kubernetes client does; it verifies the server's name too (the Service's IP is in
        # the API server's certificate).
        self._tls = ssl.create_default_context(cafile=str(ca_file))

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], directory: Path | None = None) -> InClusterApi:
        """The API server's Service from the environment the kubelet sets, the credentials from ``directory``
        (default SERVICE_ACCOUNT_DIR). ApiError when the pod is not in a cluster or has no service account token."""
        host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "")
        if not host or not port.isdigit():
            raise ApiError("not in a cluster (KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT not set)")
        directory = SERVICE_ACCOUNT_DIR if directory is None else directory
        token, ca = directory / "token", directory / "ca.crt"
        if not token.is_file() or not ca.is_file():
            raise ApiError(f"no service account token or CA in {directory} (automountServiceAccountToken off?)")
        try:
            return cls(host, int(port), token, ca)
        except (OSError, ssl.SSLError) as err:
            raise ApiError(f"cannot load the cluster CA {ca}: {err}") from err

    def _token(self) -> str:
        # Read at every request, not once: bound tokens rotate (the kubelet swaps the file well before expiry),
        # and a patch every few seconds at most makes the read free.
        try:
            return self.token_file.read_text().strip()
        except OSError as err:
            raise ApiError(f"cannot read the service account token {self.token_file}: {err}") from err

    def patch_namespaced_custom_object_status(self, group: str, version: str, namespace: str, plural: str,
                                              name: str, body: Any, *, _content_type: str = MERGE_PATCH,
                                              _request_timeout: float = REQUEST_TIMEOUT_SECONDS,
                                              **_: Any) -> None:
        """PATCH ``/apis/<group>/<version>/namespaces/<ns>/<plural>/<name>/status`` with ``body``; ApiError unless
        the server accepts it. ``_request_timeout`` bounds the connection, the TLS handshake and each read."""
        path = "/apis/{}/{}/namespaces/{}/{}/{}/status".format(*(quote(p, safe="") for p in (
            group, version, namespace, plural, name)))
        headers = {"Authorization": f"Bearer {self._token()}", "Content-Type": _content_type,
                   "Accept": "application/json", "User-Agent": "ddpjob-worker"}
        conn = http.client.HTTPSConnection(self.host, self.port, timeout=_request_timeout, context=self._tls)
        try:
            conn.request("PATCH", path, body=json.dumps(body).encode(), headers=headers)
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as err:  # refused, TLS, timeout (socket.timeout is an OSError)
            raise ApiError(f"PATCH {path}: {str(err) or type(err).__name__}") from err
        finally:
            conn.close()
        if not 200 <= response.status < 300:
            raise ApiError(f"PATCH {path}: {response.status} {response.reason}: {_status_message(data)}")


def _status_message(data: bytes) -> str:
    """The message of a Kubernetes Status answer (why a request was refused), else the start of the body."""
    try:
        return str(json.loads(data)["message"])
    except (ValueError, KeyError, TypeError):
        return data[:200].decode(errors="replace")


def patch_progress(api: StatusApi, namespace: str, name: str, progress: Mapping[str, Any]) -> None:
    """Merge ``progress`` into the DDPJob's status.progress (the one part of its status a worker may write)."""
    api.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, name, {"status": {"progress": progress}},
        _content_type=MERGE_PATCH,  # the kubernetes client's default is a JSON *patch*
        _request_timeout=REQUEST_TIMEOUT_SECONDS,
    )


class ProgressReporter:
    """Throttled, fail-soft reporting. Only rank 0 reports; on other ranks every call is a no-op. Any trouble
    (no cluster, no RBAC, API server down) is logged once and training goes on: progress is a convenience. The
    patches go out from a thread of their own (sender.py), so a slow API server never holds a training step."""

    #: A script's own reporter owns status.progress from its creation on (the runtime's counter then stays quiet).
    owns_progress = True

    def __init__(self, *, interval_seconds: float = 10.0, environ: Mapping[str, str] | None = None,
                 api: StatusApi | None = None, total_steps: int | None = None) -> None:
        if self.owns_progress:
            _script_reports.set()
        env = os.environ if environ is None else environ
        self.enabled = env.get("RANK", "0") == "0"
        self.interval = interval_seconds
        #: The global step training ends at, when the script knows it (status.progress.totalSteps): `kubectl
        #: ddpjob describe` draws the progress bar and the ETA from it. May be set later (e.g. once the data is read).
        self.total_steps = total_steps
        self.name = env.get(contract.DDPJOB_NAME, "")
        self.namespace = env.get(contract.DDPJOB_NAMESPACE, "")
        self.file = Path(env[contract.DDPJOB_PROGRESS_FILE]) if env.get(contract.DDPJOB_PROGRESS_FILE) else None
        self.restart_count = int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        self._api = api
        self._sender = Sender(self._send_now, name="ddpjob-progress-sender")
        self._cluster = self.enabled and env.get(contract.DDPJOB_REPORT_PROGRESS) == "1" and bool(self.name)
        self._last_sent = float("-inf")  # the first report goes out at once
        self._warned = False
        self._last: dict[str, Any] = {}
        self._rate_base: tuple[int, float] | None = None  # (steps, time) of the previous send, for stepRate
        # The recovery clock of this process group (status.progress.start): when the agent's rendezvous
        # completed (set by ddpjob_worker.agent), when the checkpoint was loaded, when the first step was done.
        self.start: dict[str, Any] = {"restartCount": self.restart_count}
        rdzv = env.get(contract.DDPJOB_RENDEZVOUS_TIME, "")
        if rdzv.replace(".", "", 1).isdigit():
            self.start["rendezvousTime"] = rfc3339_ms(float(rdzv))

    def _client(self) -> StatusApi:
        # At the first patch (ApiError outside a cluster). From the process's environment whatever ``environ`` says,
        # as the kubernetes client's in-cluster configuration did: the kubelet set it for the whole pod.
        if self._api is None:
            self._api = InClusterApi.from_environ(os.environ)
        return self._api

    def resumed(self, at: float | None = None, *, seconds: float | None = None) -> None:
        """Call right after ``Checkpointer.resume()`` returns: the checkpoint-loaded phase of the recovery clock;
        ``seconds``, how long the load took (``Checkpointer.last_load_seconds``; None: nothing was loaded)."""
        self.start["checkpointLoadedTime"] = rfc3339_ms(time.time() if at is None else at)
        if seconds is not None:
            self.start["checkpointLoadSeconds"] = round(float(seconds), 3)

    def report(self, *, epoch: int, step: int, global_step: int, loss: float | None = None,
               checkpoint_step: int | None = None, checkpoint_time: float | None = None,
               checkpoint_seconds: float | None = None, force: bool = False) -> None:
        """Record progress; sent at most once per interval unless ``force`` (e.g. right after a checkpoint).
        ``checkpoint_seconds``: how long that checkpoint's write took (``Checkpointer.last_save_seconds``)."""
        if not self.enabled:
            return
        progress: dict[str, Any] = {"epoch": epoch, "step": step, "globalStep": global_step,
                                    "source": SOURCE_REPORTER}
        if self.total_steps is not None:
            progress["totalSteps"] = int(self.total_steps)
        if loss is not None:
            # NaN or infinite (a diverged run) is no JSON: the API server would refuse every report, and the job
            # would look stalled while it trains. null removes the field (a merge patch).
            progress["loss"] = round(float(loss), 6) if math.isfinite(loss) else None
        if checkpoint_step is not None:
            progress["lastCheckpoint"] = {"step": checkpoint_step, "time": rfc3339(checkpoint_time)}
            if checkpoint_seconds is not None:
                progress["lastCheckpoint"]["seconds"] = round(float(checkpoint_seconds), 3)
        self._record(progress, time.time(), force)

    def report_steps(self, steps: int, last_step: float, first_step: float) -> None:
        """The runtime's report for a script that reports nothing itself (ddpjob_worker.autoprogress): ``steps``
        optimizer steps since this trainer started, the last at ``last_step``, the first at ``first_step``. Sent
        at once: the caller keeps the interval."""
        if self.enabled:
            self.start.setdefault("firstStepTime", rfc3339_ms(first_step))
            self._record({"globalStep": steps, "source": SOURCE_OPTIMIZER}, last_step, True)

    def announce_start(self) -> None:
        """Tell the operator that a new process group started (its rendezvous time): the stall check gives it the
        start-up allowance, and the recovery clock waits for its first step (the operator ignores first-step and
        checkpoint times older than the rendezvous: the previous group's). Only this group's values are written,
        so an announcement that arrives after the script's own first report takes nothing from it."""
        if self.enabled and self._cluster and "rendezvousTime" in self.start:
            self._patch({"start": {"restartCount": self.restart_count, "rendezvousTime": self.start["rendezvousTime"]}})

    def announce_finish(self, at: float | None = None) -> None:
        """Tell the operator that this group's script returned normally (``progress.finishTime``): no step is due
        any more, only the workers' exit. Sent whoever owns the rest of status.progress."""
        if self.enabled and self._cluster:
            self._patch({"finishTime": rfc3339_ms(time.time() if at is None else at)})

    def _record(self, progress: dict[str, Any], step_time: float, force: bool) -> None:
        if "firstStepTime" not in self.start:
            self.start["firstStepTime"] = rfc3339_ms(step_time)  # the first report follows the first step
        progress.update(updateTime=rfc3339(), lastStepTime=rfc3339_ms(step_time), start=dict(self.start))
        rate = self._last.get("stepRate")
        if rate is not None:
            progress["stepRate"] = rate
        self._last = progress
        if self.file is not None:  # a local file is cheap: always current, for `ddpjob run`'s view and tests
            self._write_file({**progress, "restartCount": self.restart_count, "pid": os.getpid()})
        now = time.monotonic()
        if not force and now - self._last_sent < self.interval:
            return
        self._last_sent = now
        self._update_rate(int(progress["globalStep"]), step_time)
        self.flush()

    def _update_rate(self, steps: int, at: float) -> None:
        """stepRate: steps per second between the previous send and this one (none at the first send)."""
        base, self._rate_base = self._rate_base, (steps, at)
        if base is not None and at > base[1] and steps >= base[0]:
            self._last["stepRate"] = round((steps - base[0]) / (at - base[1]), 3)

    def flush(self) -> None:
        """Send the latest progress now."""
        if not self.enabled or not self._last:
            return
        if self._cluster:
            self._patch(self._last)
        elif not self._warned and self.file is None:
            self._warn_once(f"progress reporting is off ({contract.DDPJOB_REPORT_PROGRESS} != 1 or not in a DDPJob)")

    def _patch(self, progress: Mapping[str, Any]) -> None:
        """Hand the patch to the sender's thread and return: training never waits for the API server."""
        self._sender.submit(progress)

    def drain(self, timeout: float = REQUEST_TIMEOUT_SECONDS) -> bool:
        """Wait until every report handed over so far was sent (or failed); True if that took under ``timeout``."""
        return self._sender.drain(timeout)

    def _send_now(self, progress: Mapping[str, Any]) -> None:
        try:
            patch_progress(self._client(), self.namespace, self.name, progress)
        except Exception as err:  # any failure: say so once, never stop training for it
            self._warn_once(f"cannot patch ddpjobs/{self.name} status in {self.namespace}: {err}")

    @property
    def active(self) -> bool:
        """Whether reports go anywhere (the cluster or a local file)."""
        return self.enabled and (self._cluster or self.file is not None)

    def _write_file(self, data: dict[str, Any]) -> None:
        assert self.file is not None
        tmp = self.file.with_suffix(".tmp")
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self.file)  # atomic: the reader never sees half a file
        except OSError as err:
            self._warn_once(f"cannot write {self.file}: {err}")

    def _warn_once(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("%s; training continues without progress reports", message)

"""Rank 0's progress reporter: epoch, step, loss and the last checkpoint into the DDPJob's ``status.progress``
(so ``kubectl get ddpjobs`` shows them) and, under ``ddpjob run``, into a local JSON file."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddpjob_worker import contract
from ddpjob_worker.logs import get_logger

log = get_logger("progress")

GROUP, VERSION, PLURAL = "ddpjob.io", "v1alpha1", "ddpjobs"


def rfc3339(ts: float | None = None) -> str:
    """UTC time as Kubernetes writes it."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if ts is None else ts))


def rfc3339_ms(ts: float) -> str:
    """UTC time with milliseconds (RFC 3339; the recovery clock needs better than Kubernetes' seconds)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts * 1000) % 1000:03d}Z"


class ProgressReporter:
    """Throttled, fail-soft reporting. Only rank 0 reports; on other ranks every call is a no-op. Any trouble
    (no cluster, no RBAC, API server down) is logged once and training goes on: progress is a convenience."""

    def __init__(self, *, interval_seconds: float = 10.0, environ: Mapping[str, str] | None = None,
                 api: Any | None = None) -> None:
        env = os.environ if environ is None else environ
        self.enabled = env.get("RANK", "0") == "0"
        self.interval = interval_seconds
        self.name = env.get(contract.DDPJOB_NAME, "")
        self.namespace = env.get(contract.DDPJOB_NAMESPACE, "")
        self.file = Path(env[contract.DDPJOB_PROGRESS_FILE]) if env.get(contract.DDPJOB_PROGRESS_FILE) else None
        self.restart_count = int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        self._api = api
        self._cluster = self.enabled and env.get(contract.DDPJOB_REPORT_PROGRESS) == "1" and bool(self.name)
        self._last_sent = float("-inf")  # the first report goes out at once
        self._warned = False
        self._last: dict[str, Any] = {}
        # The recovery clock of this process group (status.progress.start): when the agent's rendezvous
        # completed (set by ddpjob_worker.agent), when the checkpoint was loaded, when the first step was done.
        self.start: dict[str, Any] = {"restartCount": self.restart_count}
        rdzv = env.get(contract.DDPJOB_RENDEZVOUS_TIME, "")
        if rdzv.replace(".", "", 1).isdigit():
            self.start["rendezvousTime"] = rfc3339_ms(float(rdzv))

    def _client(self) -> Any:
        if self._api is None:
            from kubernetes import client, config  # imported late: only pods in a cluster need it

            config.load_incluster_config()  # type: ignore[no-untyped-call]
            self._api = client.CustomObjectsApi()
        return self._api

    def resumed(self, at: float | None = None) -> None:
        """Call right after ``Checkpointer.resume()`` returns: the checkpoint-loaded phase of the recovery clock."""
        self.start["checkpointLoadedTime"] = rfc3339_ms(time.time() if at is None else at)

    def report(self, *, epoch: int, step: int, global_step: int, loss: float | None = None,
               checkpoint_step: int | None = None, checkpoint_time: float | None = None,
               force: bool = False) -> None:
        """Record progress; sent at most once per interval unless ``force`` (e.g. right after a checkpoint)."""
        if not self.enabled:
            return
        if "firstStepTime" not in self.start:
            self.start["firstStepTime"] = rfc3339_ms(time.time())  # the first report follows the first step
        progress: dict[str, Any] = {"epoch": epoch, "step": step, "globalStep": global_step,
                                    "updateTime": rfc3339(), "start": dict(self.start)}
        if loss is not None:
            progress["loss"] = round(float(loss), 6)
        if checkpoint_step is not None:
            progress["lastCheckpoint"] = {"step": checkpoint_step, "time": rfc3339(checkpoint_time)}
        self._last = progress
        if self.file is not None:  # a local file is cheap: always current, for `ddpjob run`'s view and tests
            self._write_file({**progress, "restartCount": self.restart_count, "pid": os.getpid()})
        now = time.monotonic()
        if not force and now - self._last_sent < self.interval:
            return
        self._last_sent = now
        self.flush()

    def flush(self) -> None:
        """Send the latest progress now."""
        if not self.enabled or not self._last:
            return
        if self._cluster:
            try:
                self._client().patch_namespaced_custom_object_status(
                    GROUP, VERSION, self.namespace, PLURAL, self.name, {"status": {"progress": self._last}},
                    _content_type="application/merge-patch+json",  # the client's default is a JSON *patch*
                )
            except Exception as err:  # any failure: say so once, never stop training for it
                self._warn_once(f"cannot patch ddpjobs/{self.name} status in {self.namespace}: {err}")
        elif not self._warned and self.file is None:
            self._warn_once(f"progress reporting is off ({contract.DDPJOB_REPORT_PROGRESS} != 1 or not in a DDPJob)")

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

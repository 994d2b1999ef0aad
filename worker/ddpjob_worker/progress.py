"""Rank 0's progress reporter: epoch, step, loss and the last checkpoint into the DDPJob's ``status.progress``
(so ``kubectl get ddpjobs`` shows them) and, under ``ddpjob run``, into a local JSON file. A script that does not
use it still reports its steps: the recorded runner counts them (ddpjob_worker.autoprogress) and sends them
through the same path, unless the script creates a reporter of its own.

The status patch goes over HTTPS with the standard library only (ddpjob_worker.statusclient, whose names this module
re-exports): the runtime is injected into users' own images, which have Python and torch and nothing else."""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddpjob_worker import contract
from ddpjob_worker.logs import get_logger
from ddpjob_worker.sender import Sender

# The status client, re-exported (in __all__): these names were defined here before statusclient held them.
from ddpjob_worker.statusclient import (
    GROUP,
    MERGE_PATCH,
    PLURAL,
    REQUEST_TIMEOUT_SECONDS,
    SERVICE_ACCOUNT_DIR,
    VERSION,
    ApiError,
    InClusterApi,
    StatusApi,
    patch_progress,
)

__all__ = ["GROUP", "MERGE_PATCH", "PLURAL", "REQUEST_TIMEOUT_SECONDS", "SERVICE_ACCOUNT_DIR", "SOURCE_OPTIMIZER",
           "SOURCE_REPORTER", "VERSION", "ApiError", "InClusterApi", "ProgressReporter", "StatusApi", "patch_progress",
           "rfc3339", "rfc3339_ms", "script_reports"]

log = get_logger("progress")

#: After a failed or slow report the next waits twice as long, up to this many times the interval: an API server that
#: refuses, times out or is slow to answer is sent less (the operator keeps its cadence at most an eighth of the
#: job's progress deadline, so a reporter backed off to the full 4 times still reports within half of it).
MAX_BACKOFF = 4
#: A report answered slower than this doubles the backoff; one answered in a quarter of it halves it.
SLOW_SECONDS = 1.0

#: ``status.progress.source``: the script's own ProgressReporter, or the optimizer steps the runtime counted.
SOURCE_REPORTER = "Reporter"
SOURCE_OPTIMIZER = "OptimizerSteps"

# Set once the script in this process creates a ProgressReporter: its richer report then owns status.progress, and
# the runtime's step counter sends nothing, so no step is ever reported twice. At creation, not at the first
# report: a script may sleep or checkpoint between its first optimizer step and its first report, and the counter's
# report in between would carry a start record without the script's checkpoint-loaded time.
_script_reports = threading.Event()


def script_reports() -> bool:
    """Whether the script in this process reports its own progress.

    Returns:
        True once the script created a ProgressReporter (the runtime's step counter then sends nothing).
    """
    return _script_reports.is_set()


def rfc3339(ts: float | None = None) -> str:
    """UTC time as Kubernetes writes it.

    Args:
        ts: Seconds since the epoch; None: now.

    Returns:
        ``YYYY-MM-DDTHH:MM:SSZ``.
    """
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if ts is None else ts))


def rfc3339_ms(ts: float) -> str:
    """UTC time with milliseconds (RFC 3339; the recovery clock needs better than Kubernetes' seconds).

    Args:
        ts: Seconds since the epoch.

    Returns:
        ``YYYY-MM-DDTHH:MM:SS.mmmZ``.
    """
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts * 1000) % 1000:03d}Z"


class ProgressReporter:
    """Throttled, fail-soft reporting. Only rank 0 reports; on other ranks every call is a no-op. Any trouble
    (no cluster, no RBAC, API server down) is logged once and training goes on: progress is a convenience. The
    patches go out from a thread of their own (sender.py), so a slow API server never holds a training step.

    The operator may ask for a longer interval (``status.reportIntervalSeconds``, its write budget for all running
    jobs: docs/operator-scale.md), read from the answer to each report; a failed report, or one answered in over
    SLOW_SECONDS, doubles the wait before the next, up to MAX_BACKOFF times, and a quick answer halves it again.
    Forced reports never wait.

    Args:
        interval_seconds: The least time between two reports sent (``report(force=True)`` sends at once).
        environ: Where the job's name, namespace and rank come from; None: this process's environment.
        api: The API client; None: InClusterApi, made at the first report.
        total_steps: The global step training ends at, if known (``status.progress.totalSteps``).
    """

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
        self._advertised = 0.0  # the operator's status.reportIntervalSeconds, from the last answer
        self._backoff = 1
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
        """Call right after ``Checkpointer.resume()`` returns: the checkpoint-loaded phase of the recovery clock.

        Args:
            at: When the checkpoint was loaded (``time.time()``); None: now.
            seconds: How long the load took (``Checkpointer.last_load_seconds``; None: nothing was loaded).
        """
        self.start["checkpointLoadedTime"] = rfc3339_ms(time.time() if at is None else at)
        if seconds is not None:
            self.start["checkpointLoadSeconds"] = round(float(seconds), 3)

    def report(self, *, epoch: int, step: int, global_step: int, loss: float | None = None,
               checkpoint_step: int | None = None, checkpoint_time: float | None = None,
               checkpoint_seconds: float | None = None, force: bool = False) -> None:
        """Record progress; sent at most once per interval unless ``force`` (e.g. right after a checkpoint).

        Args:
            epoch: The epoch in progress.
            step: Optimizer steps done in ``epoch``.
            global_step: Optimizer steps done since the start of training.
            loss: The latest loss, if any (NaN or infinite clears it).
            checkpoint_step: The step of the last checkpoint (``Checkpointer.last_saved_step``), if any.
            checkpoint_time: When it was saved (``Checkpointer.last_saved_time``); None: now.
            checkpoint_seconds: How long its write took (``Checkpointer.last_save_seconds``).
            force: Send now, whatever the interval.
        """
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
        """The runtime's report for a script that reports nothing itself (ddpjob_worker.autoprogress). Sent at
        once: the caller keeps the interval.

        Args:
            steps: Optimizer steps since this trainer started.
            last_step: When the last of them was done (``time.time()``).
            first_step: When the first of them was done.
        """
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
        any more, only the workers' exit. Sent whoever owns the rest of status.progress.

        Args:
            at: When the script returned (``time.time()``); None: now.
        """
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
        if not force and now - self._last_sent < self.interval_now():
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
        """Wait until every report handed over so far was sent (or failed).

        Args:
            timeout: The most seconds to wait.

        Returns:
            True if every report was sent (or failed) in time.
        """
        return self._sender.drain(timeout)

    def interval_now(self, base: float | None = None) -> float:
        """The least seconds before the next routine report: ``base`` (default: ``interval_seconds``) or the
        operator's cadence, whichever is longer, times the backoff after failed reports.

        Args:
            base: The caller's own interval (the runtime's step counter keeps its own).

        Returns:
            Seconds.
        """
        return max(self.interval if base is None else base, self._advertised) * self._backoff

    def _send_now(self, progress: Mapping[str, Any]) -> None:
        t0 = time.monotonic()
        try:
            answer = patch_progress(self._client(), self.namespace, self.name, progress)
        except Exception as err:  # any failure: say so once, never stop training for it
            self._backoff = min(MAX_BACKOFF, self._backoff * 2)
            self._warn_once(f"cannot patch ddpjobs/{self.name} status in {self.namespace}: {err}")
            return
        took = time.monotonic() - t0
        if took > SLOW_SECONDS:  # a busy API server: every reporter that sees it sends less (no coordination needed)
            self._backoff = min(MAX_BACKOFF, self._backoff * 2)
        elif took < SLOW_SECONDS / 4:
            self._backoff = max(1, self._backoff // 2)
        self._advertised = _advertised(answer)

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


def _advertised(answer: Any) -> float:
    """The operator's ``status.reportIntervalSeconds`` in a report's answer (the DDPJob as stored); 0 if none."""
    status = answer.get("status") if isinstance(answer, Mapping) else None
    value = status.get(contract.STATUS_REPORT_INTERVAL) if isinstance(status, Mapping) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else 0.0


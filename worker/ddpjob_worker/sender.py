"""Status patches sent from a thread of their own, so that training never waits for the API server.

Rank 0's progress reports went out on the thread that called ``report()``: the training loop. With the API
server slow or unreachable every report held that step for up to the request timeout, and every other rank waited
for rank 0 at the next collective. Now the caller only hands its patch over. At most one patch waits: a newer one
is merged into it the way the API server merges a JSON merge patch (newer values win, nested objects merge), so a
slow server gets the latest progress, never a backlog, and no report is lost between two sends."""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

#: At interpreter exit, how long the last report may still take (a trainer that failed leaves through atexit too,
#: and its restart waits for it: seconds, not the request timeout).
EXIT_WAIT_SECONDS = 2.0


def merged(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """``new`` applied to ``old`` as a JSON merge patch (RFC 7386) without deletions: what the server would hold
    after both, so sending only the merge equals sending both in order."""
    out = dict(old)
    for key, value in new.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


class Sender:
    """Calls ``send(patch)`` from a daemon thread, started by the first ``submit``; ``send`` must not raise."""

    def __init__(self, send: Callable[[Mapping[str, Any]], None], *, name: str = "ddpjob-status-sender") -> None:
        self._send = send
        self._name = name
        self._cond = threading.Condition()
        self._pending: dict[str, Any] | None = None
        self._busy = False
        self._thread: threading.Thread | None = None

    def submit(self, patch: Mapping[str, Any]) -> None:
        """Hand a patch over and return at once."""
        with self._cond:
            self._pending = merged(self._pending or {}, patch)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
                atexit.register(self.drain, EXIT_WAIT_SECONDS)  # the script's final report
            self._cond.notify_all()

    def drain(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` seconds) until every submitted patch was sent; True if so."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending is not None or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None:
                    self._cond.wait()
                patch, self._pending, self._busy = self._pending, None, True
            try:
                self._send(patch)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

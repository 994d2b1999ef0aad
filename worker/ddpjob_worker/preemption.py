"""SIGTERM for the checkpoint library (Checkpointer's part, apart): the handler that notes it and starts the
budget's watchdog, and the collective that makes one pod's SIGTERM every rank's, so every rank takes the same
final checkpoint and exits 143 (docs/checkpoints.md, "SIGTERM")."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

#: Exit code after a SIGTERM checkpoint: 128+15, what the kubelet reports for SIGTERM. Never 0, which would
#: read as success and end the job early.
EXIT_AFTER_SIGTERM = 143


class Preemption:
    """This process's SIGTERM: noted by a handler, bounded by a watchdog, spread to every rank by ``anywhere``."""

    def __init__(self, rank: int, budget_seconds: Callable[[], float], device: torch.device,
                 distributed: bool) -> None:
        self.rank = rank
        #: Read when SIGTERM arrives (the Checkpointer's config then).
        self.budget_seconds = budget_seconds
        self._device = device
        self._distributed = distributed
        #: When this process got SIGTERM (time.monotonic), or None.
        self.since: float | None = None
        self._flag: torch.Tensor | None = None  # anywhere()'s all-reduce buffer
        self._previous_handler: Any = None

    def install(self) -> None:
        """Handle SIGTERM from now on (only the main thread may set a handler; elsewhere this does nothing)."""
        if threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)

    def uninstall(self) -> None:
        """Give SIGTERM back to the handler ``install`` replaced."""
        if self._previous_handler is not None:
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._previous_handler = None

    def _on_sigterm(self, signum: int, _frame: FrameType | None) -> None:
        if self.since is not None:
            return
        self.since = time.monotonic()
        budget = self.budget_seconds()
        os.write(2, f"[ddpjob rank={self.rank}] SIGTERM: finishing the current step, then checkpointing "
                    f"(budget {budget:.0f}s)\n".encode())
        # If the final save cannot finish in time (slow disk, a peer that never answers), leave with the
        # same non-zero code anyway; the previous checkpoint is still valid because saves are atomic.
        watchdog = threading.Timer(budget, self._budget_exceeded)
        watchdog.daemon = True
        watchdog.start()

    def _budget_exceeded(self) -> None:
        os.write(2, f"[ddpjob rank={self.rank}] SIGTERM budget of {self.budget_seconds():.0f}s "
                    f"exceeded; exiting {EXIT_AFTER_SIGTERM} without a final checkpoint\n".encode())
        os._exit(EXIT_AFTER_SIGTERM)

    def anywhere(self) -> bool:
        """Collective when distributed: whether any rank got SIGTERM (a pod's SIGTERM reaches only its own
        workers)."""
        flag = 1.0 if self.since is not None else 0.0
        if not self._distributed:
            return flag > 0
        # One tensor per run, not one per step: on torch 2.6-2.10 a gloo group's teardown at exit can hang on the
        # GIL while gloo's thread frees the last all-reduce's tensor (2 hangs in 6 runs on 2.10; 0 with this).
        if self._flag is None:
            self._flag = torch.zeros(1, device=self._device)
        self._flag.fill_(flag)
        dist.all_reduce(self._flag, op=dist.ReduceOp.MAX)
        return bool(self._flag.item() > 0)

"""A keyed asyncio work queue (client-go's workqueue semantics): events only enqueue a job's key, and each key
is processed by at most one worker at a time, so many events collapse into one reconcile pass per job."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    """Deduplicating queue: a key waits at most once; a key added while in work is re-queued when done."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._waiting: set[K] = set()
        self._active: set[K] = set()
        self._dirty: set[K] = set()
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._added: dict[K, float] = {}  # when each waiting key was queued (time.monotonic)

    def add(self, key: K) -> None:
        """Ask for one more pass of ``key``."""
        if key in self._active:
            self._dirty.add(key)
        elif key not in self._waiting:
            self._waiting.add(key)
            self._added[key] = time.monotonic()
            self._queue.put_nowait(key)

    def add_after(self, key: K, delay: float) -> None:
        """Ask for a pass of ``key`` in ``delay`` seconds; an earlier pending request wins."""
        loop = asyncio.get_running_loop()
        when = loop.time() + max(0.0, delay)
        timer = self._timers.get(key)
        if timer is not None and not timer.cancelled() and timer.when() <= when:
            return
        if timer is not None:
            timer.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> K:
        """Wait for the next key and mark it in work."""
        return (await self.get_timed())[0]

    async def get_timed(self) -> tuple[K, float]:
        """The next key, marked in work, and the seconds it waited in the queue (the queue's latency)."""
        key = await self._queue.get()
        self._waiting.discard(key)
        self._active.add(key)
        return key, max(0.0, time.monotonic() - self._added.pop(key, time.monotonic()))

    def done(self, key: K) -> None:
        """Mark ``key`` finished; re-queue it if it was added meanwhile."""
        self._active.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def forget(self, key: K) -> None:
        """Drop a pending timer (the job is gone)."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def __len__(self) -> int:
        return self._queue.qsize()

    def close(self) -> None:
        """Cancel all timers (operator shutdown)."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

"""A keyed asyncio work queue (client-go's workqueue semantics): events only enqueue a job's key, and each key
is processed by at most one worker at a time, so many events collapse into one reconcile pass per job.

Two lanes: a pass something asked for (a watch event, a timer the plan set, a write's answer) goes before the
periodic passes of a resync, which every job gets each period. At 1,000 running jobs a resync queued 1,000 passes at
once, and a pod deleted right after waited behind them: its replacement took 0.44-0.80 s instead of 0.1-0.3 s
(docs/operator-scale.md, "The steady state"). A key waiting in the periodic lane that is asked for again moves to
the first."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

URGENT, PERIODIC = 0, 1


class WorkQueue(Generic[K]):
    """Deduplicating queue: a key waits at most once; a key added while in work is re-queued when done."""

    def __init__(self) -> None:
        self._lanes: tuple[deque[tuple[int, K]], deque[tuple[int, K]]] = (deque(), deque())
        self._waiting: dict[K, tuple[int, int]] = {}  # key -> (lane, entry): an entry not named here is stale
        self._ready = asyncio.Semaphore(0)  # one release per waiting key
        self._seq = itertools.count()
        self._active: set[K] = set()
        self._dirty: dict[K, int] = {}  # keys added while in work, and the lane they go to when done
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._added: dict[K, float] = {}  # when each waiting key was queued (time.monotonic)

    def add(self, key: K, *, periodic: bool = False) -> None:
        """Ask for one more pass of ``key``; ``periodic``: a resync's pass, after every other."""
        lane = PERIODIC if periodic else URGENT
        if key in self._active:
            self._dirty[key] = min(lane, self._dirty.get(key, lane))
            return
        held = self._waiting.get(key)
        if held is not None and held[0] <= lane:
            return
        self._put(key, lane)
        if held is None:
            self._added[key] = time.monotonic()
            self._ready.release()

    def _put(self, key: K, lane: int) -> None:
        entry = next(self._seq)
        self._waiting[key] = (lane, entry)
        self._lanes[lane].append((entry, key))

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
        await self._ready.acquire()
        key = self._pop()
        self._active.add(key)
        return key, max(0.0, time.monotonic() - self._added.pop(key, time.monotonic()))

    def _pop(self) -> K:
        for lane, entries in enumerate(self._lanes):
            while entries:
                entry, key = entries.popleft()
                if self._waiting.get(key) == (lane, entry):
                    del self._waiting[key]
                    return key
        raise AssertionError("a released key is in a lane")  # one release per waiting key

    def done(self, key: K) -> None:
        """Mark ``key`` finished; re-queue it if it was added meanwhile."""
        self._active.discard(key)
        lane = self._dirty.pop(key, None)
        if lane is not None:
            self.add(key, periodic=lane == PERIODIC)

    def forget(self, key: K) -> None:
        """Drop a pending timer (the job is gone)."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def __len__(self) -> int:
        return len(self._waiting)

    def close(self) -> None:
        """Cancel all timers (operator shutdown)."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

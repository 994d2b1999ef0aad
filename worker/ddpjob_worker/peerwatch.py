"""A dead or cut-off peer noticed from inside the job within seconds (spec.rendezvous.peerTimeoutSeconds), without
waiting for Kubernetes to call its node NotReady (17-40 s) or for a collective to time out (gloo: 30 min).

Why not torch's own keep-alive: every beat is a compare-and-set of the whole pickled rendezvous state, its sweep
compares the writer's wall clock with the reader's (clock skew shifts the verdict), 2.6 cannot tune it (5 s x 3),
and a survivor does nothing when a peer is swept: it waits in its collective until its own trainers fail.

Here each agent of the round beats a counter of its own in the rendezvous store (``add(key, 1)``, on a connection of
its own whose every call gives up within a short timeout (ddpjob_worker.storeclient: torch's client does not bound an
``add``), so neither a partition nor a lost store holds the agent's main thread or the watch itself) and reads its
peers' counters. A peer's age is the time since this agent last *saw its counter change*, on this agent's monotonic
clock: no remote time is ever compared. Any gap in this agent's own polling (it was paused, starved, a read failed or
took too long, the store restarted) resets every age to zero: no verdict from a watcher that was not watching. A peer
is dead when its age reaches the budget (more for a peer not seen beating since the watch started or came back from a
store outage: the agents' watches reconnect each on its own). The agent then removes it from the rendezvous round
(ddpjob_worker.membership), exactly what torch's sweep would do 15 s or more later, and the group re-forms, with a hot
spare at once.

The beats come from the agent process, not the trainers, so a slow step, a long synchronous save, a trainer's GC
pause or a CPU-bound data loader never stops them: only a dead, frozen or cut-off pod does."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from ddpjob_worker.logs import get_logger

log = get_logger("peerwatch")

#: Fewer agents than this watch every peer; more watch their next RING ranks only (n x RING reads per poll instead
#: of n x n): a peer's silence is seen by RING watchers, and one eviction is seen by all.
WATCH_ALL_UP_TO = 16
RING = 3


class Store(Protocol):
    """What the watch needs of a store client: ddpjob_worker.storeclient.CounterClient, or a test's fake."""

    def add(self, key: str, value: int) -> int: ...

    def close(self) -> None: ...


def poll_seconds(budget: float) -> float:
    """Seconds between two beats and reads: five or more per budget, at most one a second."""
    return min(1.0, max(0.2, budget / 5))


def watched(rank: int, world: int) -> list[int]:
    """The ranks that ``rank`` watches in a group of ``world`` agents."""
    if world <= WATCH_ALL_UP_TO:
        return [r for r in range(world) if r != rank]
    return [(rank + i) % world for i in range(1, RING + 1)]


class PeerAges:
    """Pure: which peers are silent, from successive reads of their beat counters. ``observe`` takes each poll's
    counters (None: the read failed) and the observer's monotonic time, and answers the peers silent for at
    least ``budget`` seconds of uninterrupted watching."""

    def __init__(self, peers: Iterable[int], budget: float, poll: float, now: float, reconnect: float = 0.0) -> None:
        self.budget = budget
        self.max_gap = 2 * poll
        self.values: dict[int, int] = dict.fromkeys(peers, 0)
        self.changed: dict[int, float] = dict.fromkeys(self.values, now)
        self.last_poll = now
        # A peer not seen beating since the watch started or resumed gets more: agents finish a rendezvous up to a
        # poll apart, and after a store outage each one's watch reconnects on its own (a connect can take
        # ``reconnect`` seconds), so the first beats in the new store come up to that much later.
        self.grace = 2 * poll + reconnect
        self.fresh: set[int] = set(self.values)
        self.failing = False

    def observe(self, counters: Mapping[int, int] | None, now: float) -> list[int]:
        gap = counters is None or self.failing or now - self.last_poll > self.max_gap
        self.last_poll, self.failing = now, counters is None
        if counters is None:
            self._reset(now)
            return []
        for rank, value in counters.items():
            if rank in self.values and value != self.values[rank]:
                self.values[rank], self.changed[rank] = value, now
                self.fresh.discard(rank)
        if gap:
            self._reset(now)  # the values just read are the new baseline; their ages start now
            return []
        return sorted(r for r, at in self.changed.items()
                      if now - at >= self.budget + (self.grace if r in self.fresh else 0))

    def _reset(self, now: float) -> None:
        for rank in self.changed:
            self.changed[rank] = now
        self.fresh = set(self.changed)

    def ages(self, now: float) -> dict[int, float]:
        return {r: round(now - at, 1) for r, at in self.changed.items()}


class PeerWatch:
    """One daemon thread per round: beats this agent's counter and reads its peers' every poll; ``dead()`` is the
    latest verdict. The key names carry the run and the round, so an earlier round's counters never count."""

    def __init__(self, connect: Callable[[], Store], prefix: str, rank: int, world: int, budget: float,
                 clock: Callable[[], float] = time.monotonic, reconnect: float = 0.0) -> None:
        self.connect = connect
        self.prefix = prefix
        self.rank = rank
        self.budget = budget
        self.poll = poll_seconds(budget)
        self.peers = watched(rank, world)
        self.clock = clock
        self.ages = PeerAges(self.peers, budget, self.poll, clock(), reconnect)
        self._dead: list[int] = []
        self._stop = threading.Event()
        self._store: Store | None = None
        self._thread = threading.Thread(target=self._run, name=f"ddpjob-peerwatch-{rank}", daemon=True)

    def key(self, rank: int) -> str:
        return f"{self.prefix}/{rank}"

    def start(self) -> PeerWatch:
        self._thread.start()
        return self

    def stop(self, wait: float = 0.0) -> None:
        """Stop the thread; ``wait`` seconds at most for it to end (its store call in flight gives up within its
        timeout). The agent waits when it exits, so the watch's last connection closes before the process ends."""
        self._stop.set()
        if wait > 0 and self._thread.is_alive():
            self._thread.join(wait)
            log.info("peer watch stopped (%s)", "still in a store call" if self._thread.is_alive() else "ended")

    def dead(self) -> list[int]:
        return list(self._dead)

    def poll_once(self) -> list[int]:
        """One beat and one read (the thread's body; tests call it directly)."""
        counters: dict[int, int] | None
        try:
            if self._store is None:
                self._store = self.connect()
            self._store.add(self.key(self.rank), 1)
            counters = {r: int(self._store.add(self.key(r), 0)) for r in self.peers}
        except Exception as err:  # a partition, a store restart: no verdict until reads work again
            if self._store is not None:
                log.debug("peer watch: the store did not answer (%s)", err)
                self._store.close()
            self._store, counters = None, None
        self._dead = self.ages.observe(counters, self.clock())
        return self._dead

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll_once()
            self._stop.wait(self.poll)

"""This agent's place in its rendezvous round while its trainers run: whether the group it trains with is still
whole. torchrun restarts a healthy group only when its own trainers fail or a node waits to join; a peer that
dies silently (its node powered off, cut off, frozen) leaves the survivors waiting in a collective until its
timeout (gloo: 30 min by default). Here the agent notices a silent peer within ``peerTimeoutSeconds``
(ddpjob_worker.peerwatch), removes it from the round the way torch's own heartbeat sweep would, and restarts its
group once the round lost a peer this agent sees silent too (whoever removed it: this agent, another survivor,
torch's sweep), or this pod itself was removed. A hot spare then joins at once (it waits for a round with room)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from ddpjob_worker import compat, contract
from ddpjob_worker.logs import get_logger
from ddpjob_worker.peerwatch import PeerWatch

log = get_logger("membership")


def peer_timeout(environ: Mapping[str, str] = os.environ) -> float:
    """The detection budget in seconds (0: off), from the pod's environment (spec.rendezvous.peerTimeoutSeconds)."""
    raw = environ.get(contract.DDPJOB_PEER_TIMEOUT_SECONDS, "")
    try:
        return max(0.0, float(raw)) if raw else float(contract.DEFAULT_PEER_TIMEOUT_SECONDS)
    except ValueError:
        log.warning("%s=%r is not a number of seconds: using %d", contract.DDPJOB_PEER_TIMEOUT_SECONDS, raw,
                    contract.DEFAULT_PEER_TIMEOUT_SECONDS)
        return float(contract.DEFAULT_PEER_TIMEOUT_SECONDS)


def _connector(handler: Any, timeout: float) -> Any:
    """A new client of the handler's store (whichever it is now: the store keeper may have switched it) whose
    calls give up after ``timeout``: a partitioned store must cost the watch a poll, never the agent a minute."""

    def connect() -> Any:
        store = compat.handler_store(handler)
        # A plain socket first: while the store is down, a torch client's failed connect raises a C++ error whose
        # backtrace takes seconds to format under load, and a process that exits meanwhile aborts (torch's
        # "terminate called without an active exception"). Refused or timed out here costs nothing.
        socket.create_connection((store.host, store.port), timeout).close()
        limit = timedelta(seconds=timeout)
        return compat.connect_store(store.host, store.port, limit, limit, compat.store_uses_libuv(store))

    return connect


class Membership:
    """Started when a round completes, asked by the monitor loop whether the round is still whole."""

    def __init__(self, handler: Any, rank: int, world: int, budget: float) -> None:
        self.handler = handler
        self.world = world
        self.budget = budget
        self.round = compat.handler_state(handler).round
        self.me = compat.this_node(handler)
        prefix = f"ddpjob.peers/{handler.get_run_id()}/{self.round}"
        self.timeout = min(2.0, budget / 2)
        self.watch = PeerWatch(_connector(handler, self.timeout), prefix, rank, world, budget, reconnect=self.timeout)
        if world > 1:
            self.watch.start()

    @classmethod
    def start(cls, handler: Any, rank: int, world: int, environ: Mapping[str, str] = os.environ) -> Membership | None:
        """None when the watch is off (peerTimeoutSeconds 0) or this torch's handler cannot evict a peer."""
        budget = peer_timeout(environ)
        if budget <= 0:
            return None
        if not compat.capabilities().peer_eviction:
            log.warning("this torch's rendezvous handler cannot remove a silent peer (update ddpjob_worker.compat): "
                        "a lost peer is noticed only by torch's heartbeat expiry or a collective's timeout")
            return None
        return cls(handler, rank, world, budget)

    def stop(self, final: bool = False) -> None:
        """Stop watching; ``final``: the agent exits, so wait for the watch's store call in flight to end."""
        self.watch.stop(2 * self.timeout + self.watch.poll + 2 if final else 0.0)

    def lost(self) -> str | None:
        """Why this group must re-form now, or None while it is whole. Removes the peers the watch found silent."""
        dead = self.watch.dead()
        if dead:
            self._evict(dead)
        state = compat.handler_state(self.handler)  # as the monitor loop's last sync left it
        if state.round != self.round or self.me not in state.participants:
            return "this pod was removed from its rendezvous round (its peers took it for lost)"
        missing = self.world - len(state.participants)
        if dead and missing > 0:
            # Only for a silence this agent saw itself: a peer that left the round on its way out ended its
            # processes, its sockets are closed and the collectives fail by themselves, after the peer's
            # SIGTERM checkpoint, which every rank writes and none may be killed in.
            return (f"{missing} of the group's {self.world} pods are gone from rendezvous round {self.round} "
                    f"(silent: rank {', '.join(map(str, dead))})")
        return None

    def _evict(self, dead: list[int]) -> None:
        try:
            removed = compat.evict(self.handler, self.round, dead)
        except Exception as err:  # the store is unreachable: the store keeper's business; ask again next poll
            log.info("could not remove silent rank(s) %s from the round: %s: %s", dead, type(err).__name__, err)
            return
        if removed:
            ages = self.watch.ages.ages(self.watch.clock())
            log.warning("rank(s) %s silent for %s s (peerTimeoutSeconds %g): removed %s from rendezvous round %d",
                        ", ".join(map(str, dead)), ", ".join(f"{ages.get(r, 0):g}" for r in dead), self.budget,
                        ", ".join(removed), self.round)

"""This agent's place in its rendezvous round while its trainers run: whether the group it trains with is still
whole. torchrun restarts a healthy group only when its own trainers fail or a node waits to join; a peer that
dies silently (its node powered off, cut off, frozen) leaves the survivors waiting in a collective until its
timeout (gloo: 30 min by default). Here the agent notices a silent peer within ``peerTimeoutSeconds``
(ddpjob_worker.peerwatch), removes it from the round the way torch's own heartbeat sweep would, and restarts its
group once the round lost a peer this agent sees silent too (whoever removed it: this agent, another survivor,
torch's sweep), or its peers formed a new round without this pod. A hot spare then joins at once (it waits for a
round with room)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ddpjob_worker import compat, contract, peerreport
from ddpjob_worker.logs import get_logger
from ddpjob_worker.peerwatch import PeerWatch
from ddpjob_worker.storeclient import CounterClient

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
    connect and calls give up after ``timeout``: a lost or partitioned store must cost the watch a poll, never
    the agent a minute (torch's own client does not bound an ``add``: ddpjob_worker.storeclient)."""

    def connect() -> CounterClient:
        store = compat.handler_store(handler)
        return CounterClient(store.host, store.port, timeout)

    return connect


class Membership:
    """Started when a round completes, asked by the monitor loop whether the round is still whole."""

    _told_unsupported = False

    def __init__(self, handler: Any, rank: int, world: int, budget: float,
                 report: peerreport.PeerReport | None = None) -> None:
        self.handler = handler
        self.world = world
        self.budget = budget
        state = compat.handler_state(handler)
        self.round = state.round
        # Each rank's node in this round: a peer that another agent (or torch's sweep) removed is gone from the
        # state by the time this agent reports it, and the report needs its pod's name.
        self.nodes = {int(rank): str(node) for node, rank in state.participants.items()}
        self._reported: set[int] = set()
        self.me = compat.this_node(handler)
        prefix = f"ddpjob.peers/{handler.get_run_id()}/{self.round}"
        self.timeout = min(2.0, budget / 2)
        self._told_removed = False
        self.report = report if report is not None else peerreport.PeerReport()
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
            if cls._told_unsupported:
                return None
            cls._told_unsupported = True  # once per agent, not at every round
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
        why = verdict(self.round, self.world, dead, state.round, len(state.participants))
        if why is not None and dead and state.round == self.round:
            self._report(gone(dead, self.nodes, {str(n) for n in state.participants}, self._reported))
        if why is None and self.me not in state.participants and not self._told_removed:
            self._told_removed = True
            log.warning("this pod is no longer listed in rendezvous round %d, yet its group trains on: torch's "
                        "heartbeat sweep took it for lost (its keep-alive waited on a lost store?); it re-forms "
                        "with the group at the next restart", self.round)
        return why

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

    def _report(self, ranks: list[int]) -> None:
        """The operator replaces them now, not when Kubernetes calls their node NotReady (a job without a spare
        waits for that replacement); whoever removed them. One silence for all: they were judged by one poll."""
        if not ranks:
            return
        self._reported.update(ranks)
        ages = self.watch.ages.ages(self.watch.clock())
        silent_for = max(ages.get(r, self.budget) for r in ranks)
        self.report.silent({self.nodes[r]: silent_for for r in ranks})


def gone(dead: list[int], nodes: dict[int, str], listed: set[str], reported: set[int]) -> list[int]:
    """Pure: the silent ranks (``dead``, this agent's own verdict) whose nodes (``nodes``: rank -> node of the
    watched round) are no longer ``listed`` in the round and not ``reported`` yet: removed by this agent, another
    survivor or torch's sweep, each is reported once per agent."""
    return [r for r in dead if r not in reported and r in nodes and nodes[r] not in listed]


def verdict(watched_round: int, world: int, dead: list[int], round_now: int, participants: int) -> str | None:
    """Pure: why the group that formed ``watched_round`` (``world`` agents) must re-form, from the round the store
    holds now (``round_now``, with ``participants``) and the peers this agent's watch finds silent (``dead``);
    None while it trains on. Whether this pod is still listed does not count (see the end)."""
    if round_now != watched_round:
        # Its peers took this pod for lost and formed a new round without it (it was frozen or cut off): its
        # trainers must stop (fencing) and it joins again, as a spare if the round is full.
        return (f"this pod was removed from its rendezvous round {watched_round}: its peers formed round "
                f"{round_now} without it")
    missing = world - participants
    if dead and missing > 0:
        # Only for a silence this agent saw itself: a peer that left the round on its way out ended its processes,
        # its sockets are closed and the collectives fail by themselves, after the peer's SIGTERM checkpoint,
        # which every rank writes and none may be killed in.
        return (f"{missing} of the group's {world} pods are gone from rendezvous round {watched_round} "
                f"(silent: rank {', '.join(map(str, dead))})")
    # Not listed but the same round: either the peer that removed it kills its trainers now (the collectives
    # fail here too, and the round moves on within a poll), or torch's heartbeat sweep removed it while its
    # keep-alive waited on a lost store and the group is healthy: killing it would cost a restart for nothing.
    return None


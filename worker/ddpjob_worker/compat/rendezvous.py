"""The c10d rendezvous handler's private names (DynamicRendezvousHandler, its state holder and store), part of
ddpjob_worker.compat, which re-exports every name here: the pod agent leaves its round, tunes its polls, switches
its store after a store loss (ddpjob_worker.storekeeper) and removes a silent peer (ddpjob_worker.membership).
The same names in torch 2.6 and 2.15; ``compat.capabilities`` probes each group of them."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any


def rendezvous_settings(handler: Any) -> Any:
    """The handler's RendezvousSettings (min/max nodes, timeouts), or None for another kind of handler."""
    return getattr(handler, "_settings", None)


def leave_round(handler: Any) -> None:
    """Take this node out of the handler's current round, as torchrun's own re-rendezvous does first; raises when
    this handler or torch cannot (the caller falls back on the heartbeat expiry)."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousExitOp

    handler._stop_heartbeats()
    handler._op_executor.run(_RendezvousExitOp(), handler._get_deadline(handler._settings.timeout.close))


def round_store(handler: Any) -> Any:
    """The handler's store as the agents of the current round use it (prefixed by the round)."""
    return handler._get_store()


def set_poll_interval(handler: Any, seconds: float) -> bool:
    """Make the handler re-read the rendezvous state every ``seconds`` (its state cache and its wait between
    polls, both 1 s in torch); False, nothing changed, for a handler or a torch without them."""
    holder = getattr(handler, "_state_holder", None)
    if rendezvous_settings(handler) is None or not hasattr(holder, "_cache_duration"):
        return False
    holder._cache_duration = seconds  # type: ignore[union-attr]
    shorten_rendezvous_poll(seconds)
    return True


def shorten_rendezvous_poll(poll: float) -> None:
    """Replace dynamic_rendezvous's 1 s ``_delay`` (its only delay of exactly 1 s is the poll) with ``poll``."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous, utils

    def delay(seconds: float | tuple[float, float]) -> None:  # torch passes it by keyword: keep the name
        utils._delay(poll if seconds == 1 else seconds)

    setattr(dynamic_rendezvous, "_delay", delay)  # noqa: B010 - a private name of the module


def check_reconnectable(handler: Any) -> None:
    """Raise AttributeError naming what is missing when the handler's store cannot be switched."""
    holder, store = handler._state_holder, handler._store
    _ = (holder._backend._store, holder._state, store.host, store.port, handler._heartbeat_lock)


def handler_store(handler: Any) -> Any:
    """The handler's TCPStore client (its host, port and timeout say where to reconnect)."""
    return handler._store


def handler_state(handler: Any) -> Any:
    """The rendezvous state the handler last read or wrote (round, participants, spares, heartbeats)."""
    return handler._state_holder.state


def heartbeat_lock(handler: Any) -> Any:
    """The lock the handler's keep-alive thread holds while it uses the state holder."""
    return handler._heartbeat_lock


def switch_store(handler: Any, store: Any, run_id: str, state_bits: bytes) -> None:
    """Point the handler and its state holder at ``store``; ``state_bits`` are written there unless another agent
    was first, whose state is adopted instead. Call with ``heartbeat_lock(handler)`` held."""
    import pickle

    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    backend = C10dRendezvousBackend(store, run_id)  # seeds the key a new store lacks
    answer = backend.set_state(state_bits, None)  # compare-and-set against the empty key
    if answer is None:
        raise RuntimeError("the new store returned no rendezvous state")
    bits, token, _ = answer
    holder = handler._state_holder
    holder._backend, handler._store = backend, store
    holder._state, holder._token, holder._dirty = pickle.loads(bits), token, False
    holder._last_sync_time = -1.0  # the next read goes to the store, not to the cache


def renew_node(handler: Any, incarnation: int) -> Any:
    """Give the handler's node a descriptor no other incarnation of this pod has; returns it. torch's is
    ``<fqdn>_<pid>_<local id>``, and an agent that is its container's first process has the same pid in every
    incarnation of a pod, so a replaced pod's old agent (alive on a cut-off node until its kubelet is back) and
    its replacement were one participant to the rendezvous: the old one leaving took the new one out of the
    round, and its heartbeats kept the new one's alive. The pid is identity only (torch logs it); the address
    stays the pod's FQDN, which the peers connect to. Call before the first rendezvous."""
    import dataclasses

    node = dataclasses.replace(handler._this_node, pid=incarnation)
    handler._this_node = node
    handler._op_executor._node = node
    return node


def this_node(handler: Any) -> Any:
    """The handler's own node (the key of ``participants`` in the rendezvous state)."""
    return handler._this_node


def evict(handler: Any, round_: int, ranks: Iterable[int]) -> list[str]:
    """Remove the participants of round ``round_`` that have these ranks, exactly as torch's heartbeat sweep
    removes a node whose heartbeat expired (its _sanitize: participants, wait and spare lists, and the round's
    epilogue), only sooner; a compare-and-set, retried while other agents write. The nodes removed: none when the
    round moved on or another agent removed them first."""
    holder, wanted = handler._state_holder, set(ranks)
    with handler._heartbeat_lock:
        holder._last_sync_time = -1.0  # read the store, not the cache
        holder.sync()
        for _ in range(20):
            state = holder.state
            nodes = [n for n, r in state.participants.items() if r in wanted] if state.round == round_ else []
            if not nodes or not state.complete:
                return []
            for node in nodes:  # older than any expiry: torch's own sweep takes them out
                state.last_heartbeats[node] = datetime.min.replace(tzinfo=UTC)
            holder._sanitize()
            holder.mark_dirty()
            if holder.sync():
                return [str(n) for n in nodes]
    return []


def connect_store(host: str, port: int, connect_timeout: timedelta, timeout: timedelta, libuv: bool) -> Any:
    """A client of the TCPStore at host:port (public torch.distributed.TCPStore): waits at most
    ``connect_timeout`` for the server, then uses ``timeout`` for every call."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    store = TCPStore(host, port, is_master=False, timeout=connect_timeout, wait_for_workers=False, use_libuv=libuv)
    store.set_timeout(timeout)
    return store


def store_uses_libuv(store: Any) -> bool:
    """Whether a store client speaks through libuv (torch's default since 2.4); True when it does not say."""
    return bool(getattr(store, "libuvBackend", True))

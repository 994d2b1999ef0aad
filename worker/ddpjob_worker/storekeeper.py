"""A lost rendezvous store must not stop a training group that is healthy.

torchrun's agent reads the rendezvous store every monitor interval (``num_nodes_waiting``) and treats any error
as fatal: deleting the store pod (or losing its node) made every agent exit 200 and every pod of the job was
replaced, although the trainers' own process group never used that store (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1:
rank 0's agent hosts the workers' store). The store is needed again only when the group re-forms.

So the agent keeps its group training and, about once a second, connects to the store's address again (the
operator recreates the store pod behind the same Service name). A new store is empty: the first agent that
reaches it writes back the rendezvous state it last saw (round, participants, the hot spares in the redundancy
list, with fresh heartbeats, since a healthy group proves its members alive); the others adopt what is there. A
later fault then re-forms the group exactly as if the store had never gone, and a spare keeps waiting as a spare
instead of joining an empty round as a participant. If the store never comes back, nothing is lost: the next
rendezvous fails as before and the pod exits 200 to be replaced.

This uses private attributes of torch's DynamicRendezvousHandler and its state holder, reached through
ddpjob_worker.compat; any other handler, or a torch that renamed them, keeps plain torchrun behaviour (exit 200),
said once in the log.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from ddpjob_worker import compat
from ddpjob_worker.logs import get_logger

log = get_logger("storekeeper")

#: Seconds between two attempts to reach the store again (each attempt waits at most CONNECT_TIMEOUT).
RETRY_SECONDS = 1.0
CONNECT_TIMEOUT = timedelta(seconds=1)


def is_store_loss(err: BaseException) -> bool:
    """A rendezvous call failed because the store could not be reached (not a timeout or a closed rendezvous)."""
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

    return isinstance(err, RendezvousConnectionError)


def connect(host: str, port: int, timeout: timedelta, libuv: bool) -> Any:
    """A client of the store at host:port, or an exception after CONNECT_TIMEOUT (the name may not resolve yet:
    the new store pod is not ready); later calls wait ``timeout`` as before."""
    return compat.connect_store(host, port, CONNECT_TIMEOUT, timeout, libuv)


def refreshed(state: Any) -> Any:
    """A copy of a rendezvous state whose every known node has a heartbeat of now: a store that comes back empty
    must not make the first sync after it judge the whole group dead (heartbeats stopped while it was gone)."""
    copy = pickle.loads(pickle.dumps(state))
    now = datetime.now(UTC)
    for node in copy.last_heartbeats:
        copy.last_heartbeats[node] = now
    return copy


class StoreKeeper:
    """Reconnects a DynamicRendezvousHandler to its store after the store was lost, restoring the state."""

    def __init__(self, handler: Any, *, connector: Callable[..., Any] = connect,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._handler = handler
        self._connect = connector
        self._clock = clock
        self.lost_since: float | None = None
        self._last_try = float("-inf")
        self.usable = self._probe()

    def _probe(self) -> bool:
        try:
            compat.check_reconnectable(self._handler)
            return True
        except AttributeError as err:
            log.warning("this rendezvous handler cannot be reconnected to a new store (%s): losing the store "
                        "ends this pod (exit 200), as plain torchrun does", err)
            return False

    def lost(self, err: BaseException) -> None:
        """The store could not be reached: remember since when (logged once per loss)."""
        if self.lost_since is None:
            self.lost_since = self._clock()
            log.warning("the rendezvous store is unreachable (%s); the workers keep training, reconnecting "
                        "about every %.0f s", err, RETRY_SECONDS)

    def try_reconnect(self) -> bool:
        """One attempt, at most every RETRY_SECONDS: connect, restore the state into the new store, switch the
        handler over. True once switched."""
        if self.lost_since is None or not self.usable:
            return False
        now = self._clock()
        if now - self._last_try < RETRY_SECONDS:
            return False
        self._last_try = now
        old = compat.handler_store(self._handler)
        try:
            store = self._connect(old.host, old.port, old.timeout, compat.store_uses_libuv(old))
            self._switch(store)
        except Exception as err:  # the new store is not up yet: the next attempt comes a second later
            if compat.is_signal(err):  # SIGTERM arrived during the attempt (it takes up to a second): the pod ends
                raise
            log.debug("rendezvous store not back yet: %s", err)
            return False
        log.info("reconnected to the rendezvous store %s:%d after %.1f s; round %d restored (%d participants, %d "
                 "waiting as spares)", old.host, old.port, now - self.lost_since, self.state.round,
                 len(self.state.participants), len(self.state.redundancy_list))
        self.lost_since = None
        return True

    @property
    def state(self) -> Any:
        return compat.handler_state(self._handler)

    def _switch(self, store: Any) -> None:
        handler = self._handler
        with compat.heartbeat_lock(handler):  # the keep-alive thread uses the same state holder
            # The first agent back writes the state it last saw; the others get that one.
            compat.switch_store(handler, store, handler.get_run_id(), pickle.dumps(refreshed(self.state)))

    def wait(self, deadline: float, sleep: Callable[[float], None] = time.sleep) -> bool:
        """Block until reconnected or ``deadline`` (a monotonic time); True when reconnected."""
        while self._clock() < deadline:
            if self.try_reconnect():
                return True
            sleep(min(RETRY_SECONDS, max(0.0, deadline - self._clock())))
        return False

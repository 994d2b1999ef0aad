"""Leader election over a coordination.k8s.io/v1 Lease, the way client-go's leaderelection does it, so that two
operator replicas never both write: a replica reconciles only while it holds the Lease, renews it every
``retry`` seconds, and exits when it could not renew for ``renew_deadline`` seconds; a standby takes the Lease
once it has seen the holder's record unchanged for ``lease`` seconds (by its own clock: the record's times are
another machine's). ``renew_deadline < lease`` is what keeps two writers apart: the old leader has stopped writing
(kube/client.py asks :func:`may_write` right before each request goes out, after its waits for a slot and the
rate limit) before any standby may take over, and a :class:`Watchdog` thread ends the process at the deadline
whatever its event loop is doing. A write already on its way when the leader froze is what the rest of the margin
(Timing.error) and the status write's precondition (the resourceVersion it was planned from) are for.
A leader that stops cleanly (SIGTERM: a rollout, ``kubectl drain``) releases the Lease, and a standby takes it
within ``retry`` seconds instead of ``lease``. A deleted Lease is created again only once it has been missing for
``lease`` seconds (the leader that held it may still write until its renew deadline), except by that leader.

The decisions are pure functions (table tests in tests/unit/operator/test_leader.py); :class:`Elector` does the
I/O through any :class:`LeaseAPI` (the operator's is leader_io.HttpLeases, an aiohttp session of its own, because
kopf's client starts only after the Lease is held)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from ddpjob_operator.metrics import registry as metrics

log = logging.getLogger("ddpjob.leader")

Obj = dict[str, Any]


#: client-go's JitterFactor: a standby waits up to this many retry periods between tries.
JITTER = 1.2


@dataclasses.dataclass(frozen=True, slots=True)
class Timing:
    """Seconds: how long a record unchanged means its holder is gone (``lease``), how long a leader may fail to
    renew before it stops (``renew_deadline``), and how often it renews or a standby tries (``retry``). The
    defaults are kube-controller-manager's."""

    lease: float = 15.0
    renew_deadline: float = 10.0
    retry: float = 2.0

    def error(self) -> str | None:
        """Why these cannot keep two leaders apart, or None. client-go's rule (leaderelection.NewLeaderElector):
        lease > renew deadline > JITTER x retry; and one of ours: lease - renew deadline >= retry, the margin in
        which a write sent right before the old leader's deadline must land before a standby may take over (one
        exchange with the API server, which the elector itself allows a retry period). 15/14/4 passes client-go's
        rule with a margin of 1 s for a 4 s exchange."""
        lease, renew, retry = self.lease, self.renew_deadline, self.retry
        if retry <= 0 or renew <= JITTER * retry:
            return (f"the renew deadline ({renew:g}s) must be more than {JITTER:g} x the retry period ({retry:g}s): a "
                    "leader must get more than one try to renew")
        if lease <= renew:
            return (f"the lease duration ({lease:g}s) must be more than the renew deadline ({renew:g}s): a leader "
                    "must stop writing before a standby may take over")
        if lease - renew < retry:
            return (f"the lease duration ({lease:g}s) must exceed the renew deadline ({renew:g}s) by at least the "
                    f"retry period ({retry:g}s): a write sent right before the deadline must land before a standby "
                    "may take over")
        if lease != int(lease):
            return f"the lease duration must be whole seconds (Lease.spec.leaseDurationSeconds), not {lease:g}"
        return None


DEFAULT_TIMING = Timing()


def micro_time(at: datetime) -> str:
    """A Lease's MicroTime."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def record_key(lease: Mapping[str, Any]) -> tuple[str, str, str]:
    """What changes whenever the holder renews: a standby restarts its clock on every change."""
    spec = lease.get("spec") or {}
    return (str(spec.get("holderIdentity") or ""), str(spec.get("renewTime") or ""),
            str((lease.get("metadata") or {}).get("resourceVersion") or ""))


def held_by_other(lease: Mapping[str, Any], me: str, unchanged_for: float) -> bool:
    """Whether another replica holds the Lease: it names a holder other than ``me`` whose record this replica has
    seen unchanged for less than the lease duration the record states."""
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity") or ""
    duration = float(spec.get("leaseDurationSeconds") or 0)
    return bool(holder) and holder != me and unchanged_for < duration


def claimed(lease: Mapping[str, Any] | None, me: str, now: datetime, timing: Timing) -> Obj:
    """The spec that makes ``me`` the holder: a renewal keeps acquireTime and the transition count, a takeover
    sets acquireTime and counts one more transition."""
    spec = (lease or {}).get("spec") or {}
    holder = spec.get("holderIdentity") or ""
    mine = holder == me
    return {
        "holderIdentity": me,
        "leaseDurationSeconds": int(timing.lease),
        "acquireTime": spec.get("acquireTime") if mine and spec.get("acquireTime") else micro_time(now),
        "renewTime": micro_time(now),
        "leaseTransitions": int(spec.get("leaseTransitions") or 0) + (1 if holder and not mine else 0),
    }


def released(lease: Mapping[str, Any], now: datetime) -> Obj:
    """The spec a leader leaves when it stops cleanly: no holder, so a standby takes over at its next try."""
    spec = dict(lease.get("spec") or {})
    spec.update(holderIdentity=None, leaseDurationSeconds=1, renewTime=micro_time(now))
    return spec


class LeaseAPI(Protocol):
    async def get(self) -> Obj | None: ...
    async def create(self, spec: Obj) -> Obj | None:
        """The created Lease, None if another replica created it first."""
    async def replace(self, lease: Obj, spec: Obj) -> Obj | None:
        """The Lease with ``spec``, conditional on ``lease``'s resourceVersion; None on a conflict."""


class Watchdog:
    """Calls ``expired`` from a thread of its own once the deadline passes unrenewed: the exit on a lost Lease must
    not wait for the event loop, which a blocking call, a long pause or a stopped process (SIGSTOP) holds; a poll
    on that loop came seconds late, or never. ``expired`` runs at most once."""

    def __init__(self, expired: Callable[[], None], clock: Callable[[], float] = time.monotonic) -> None:
        self.expired, self.clock = expired, clock
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="ddpjob-lease-watchdog", daemon=True)

    def arm(self, deadline: float) -> None:
        """Expire at ``deadline`` (on ``clock``) unless :meth:`arm` moves it first; starts the thread."""
        with self._cond:
            self._deadline = deadline
            self._cond.notify()
        if not self._thread.is_alive() and not self._stopped:
            self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while not self._stopped:
                left = (self._deadline or 0.0) - self.clock()
                if left <= 0:
                    break
                self._cond.wait(left)
            if self._stopped:
                return
        self.expired()


#: The elector of this process, when it runs with leader election: kube/client.py's writes ask it.
_current: Elector | None = None


def may_write() -> bool:
    """Whether this process may write to the API: always without leader election; with it, only while the Lease
    is held and was renewed within the renew deadline."""
    return _current is None or _current.leading()


class Elector:
    """Acquires, renews and releases the Lease for ``identity``."""

    def __init__(self, api: LeaseAPI, identity: str, timing: Timing,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], datetime] = lambda: datetime.now(UTC),
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.api, self.identity, self.timing = api, identity, timing
        self.clock, self.wall, self.sleep = clock, wall, sleep
        self._seen: tuple[tuple[str, str, str], float] | None = None
        self._missing_since: float | None = None
        self._renewed_at: float | None = None
        self._lease: Obj | None = None
        self._watchdog: Watchdog | None = None

    def leading(self) -> bool:
        return self._renewed_at is not None and self.clock() - self._renewed_at < self.timing.renew_deadline

    def holder(self) -> str:
        """The holder this replica last saw ('' for none)."""
        return str(((self._lease or {}).get("spec") or {}).get("holderIdentity") or "")

    async def try_once(self) -> bool:
        """One try to take or renew the Lease; True if this replica holds it now."""
        lease = await self.api.get()
        now = self.clock()
        if lease is None:
            return await self._create(now)
        self._missing_since = None
        key = record_key(lease)
        if self._seen is None or self._seen[0] != key:
            self._seen = (key, now)
        self._lease = lease
        if held_by_other(lease, self.identity, now - self._seen[1]):
            return False
        return self._held(await self.api.replace(lease, claimed(lease, self.identity, self.wall(), self.timing)), now)

    async def _create(self, now: float) -> bool:
        """The Lease is missing (never made, or deleted): create it, at once if this replica leads, else only once
        it has been missing for a lease duration, by this replica's clock. The leader that held a deleted Lease may
        write until its renew deadline; a standby that made a new Lease at once would lead beside it."""
        if self._missing_since is None:
            self._missing_since = now
        if not self.leading() and now - self._missing_since < self.timing.lease:
            log.info("lease missing for %.1fs: created once it has been missing for %gs", now - self._missing_since,
                     self.timing.lease)
            return False
        return self._held(await self.api.create(claimed(None, self.identity, self.wall(), self.timing)), now)

    def _held(self, lease: Obj | None, tried_at: float) -> bool:
        if lease is None:
            return False
        self._lease, self._renewed_at = lease, tried_at
        if self._watchdog is not None:
            self._watchdog.arm(tried_at + self.timing.renew_deadline)
        return True

    def _call_timeout(self) -> float:
        """How long one exchange with the API server may take: a retry period (at least 1 s)."""
        return max(self.timing.retry, 1.0)

    async def _try(self) -> bool:
        """:meth:`try_once`, bounded by the retry period; an API error is a failed try."""
        try:
            async with asyncio.timeout(self._call_timeout()):
                return await self.try_once()
        except Exception as err:
            log.warning("lease %s: try failed: %r", "renew" if self.leading() else "acquire", err)
            return False

    async def acquire(self) -> float:
        """Wait until this replica holds the Lease; the seconds it waited."""
        started = self.clock()
        log.info("%s: waiting to lead (lease %gs, renew deadline %gs, retry %gs)", self.identity,
                 self.timing.lease, self.timing.renew_deadline, self.timing.retry)
        while not await self._try():
            if self.holder() and self.holder() != self.identity:
                log.debug("lease held by %s", self.holder())
            await self.sleep(self.timing.retry * random.uniform(1.0, JITTER))
        waited = self.clock() - started
        spec = (self._lease or {}).get("spec") or {}
        log.info("%s: leading after %.1fs (lease transitions: %s)", self.identity, waited,
                 spec.get("leaseTransitions"))
        metrics.LEADER.set(1)
        return waited

    async def keep(self, lost: Callable[[], None]) -> None:
        """Renew every retry period; ``lost`` is called once a renewal has not succeeded for the renew deadline, by
        a :class:`Watchdog` (a thread: on time even while this loop cannot run), or by this loop if it sees it
        first."""
        once = threading.Lock()

        def expired() -> None:
            if once.acquire(blocking=False):
                metrics.LEADER.set(0)
                log.error("%s: lease not renewed for %gs: leadership lost", self.identity, self.timing.renew_deadline)
                lost()

        self._watchdog = Watchdog(expired, self.clock)
        if self._renewed_at is not None:
            self._watchdog.arm(self._renewed_at + self.timing.renew_deadline)
        try:
            while True:
                await self.sleep(self.timing.retry)
                if not await self._try() and not self.leading():
                    expired()
                    return
        finally:
            self._watchdog.stop()
            self._watchdog = None

    async def release(self) -> None:
        """Give the Lease up (a clean stop), if this replica still holds it."""
        lease = self._lease
        if not self.leading() or lease is None:
            return
        self._renewed_at = None
        metrics.LEADER.set(0)
        try:
            async with asyncio.timeout(self._call_timeout()):
                done = await self.api.replace(lease, released(lease, self.wall()))
            log.info("%s: lease %s", self.identity, "released" if done else "not released (changed meanwhile)")
        except Exception as err:
            log.warning("%s: lease not released: %r", self.identity, err)


def install(elector: Elector | None) -> None:
    """Make ``elector`` the one :func:`may_write` asks (None: no leader election)."""
    global _current
    _current = elector

"""Leader election's decisions (table tests) and two electors over one in-memory Lease with a fake clock: who
leads, when a standby may take over, and that a leader stops writing before anyone else may start."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from ddpjob_operator.kube import leader

T = leader.Timing(lease=15, renew_deadline=10, retry=2)
NOW = datetime(2026, 11, 26, 12, 0, 0, tzinfo=UTC)


def lease(holder: str | None, duration: int = 15, transitions: int = 0, rv: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": "ddpjob-operator", "resourceVersion": rv},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration, "leaseTransitions": transitions,
                     "acquireTime": "2026-11-26T11:00:00.000000Z", "renewTime": "2026-11-26T11:59:59.000000Z"}}


@pytest.mark.parametrize(("record", "unchanged_for", "held"), [
    (lease("b"), 0.0, True),
    (lease("b"), 14.9, True),
    (lease("b"), 15.0, False),  # unchanged for its whole duration: the holder is gone
    (lease("b", duration=1), 1.5, False),  # a released lease says 1 s
    (lease("a"), 0.0, False),  # mine
    (lease(None), 0.0, False),  # released
    (lease(""), 0.0, False),
])
def test_held_by_other(record: dict[str, Any], unchanged_for: float, held: bool) -> None:
    assert leader.held_by_other(record, "a", unchanged_for) is held


@pytest.mark.parametrize(("record", "acquire_kept", "transitions"), [
    (None, False, 0),  # a new Lease
    (lease("a", transitions=3), True, 3),  # a renewal
    (lease("b", transitions=3), False, 4),  # a takeover
    (lease(None, transitions=3), False, 3),  # after a release: no holder taken from
])
def test_claimed(record: dict[str, Any] | None, acquire_kept: bool, transitions: int) -> None:
    spec = leader.claimed(record, "a", NOW, T)
    assert spec["holderIdentity"] == "a" and spec["leaseDurationSeconds"] == 15
    assert spec["renewTime"] == "2026-11-26T12:00:00.000000Z"
    assert (spec["acquireTime"] == "2026-11-26T11:00:00.000000Z") is acquire_kept
    assert spec["leaseTransitions"] == transitions


def test_released_leaves_no_holder_and_keeps_the_count() -> None:
    spec = leader.released(lease("a", transitions=2), NOW)
    assert spec["holderIdentity"] is None and spec["leaseDurationSeconds"] == 1 and spec["leaseTransitions"] == 2


@pytest.mark.parametrize(("timing", "ok"), [
    (leader.Timing(), True),
    (leader.Timing(lease=15, renew_deadline=15, retry=2), False),  # two leaders for an instant
    (leader.Timing(lease=15, renew_deadline=10, retry=10), False),
    (leader.Timing(lease=15, renew_deadline=10, retry=0), False),
    (leader.Timing(lease=15.5, renew_deadline=10, retry=2), False),
])
def test_timing(timing: leader.Timing, ok: bool) -> None:
    assert (timing.error() is None) is ok


class MemoryLease:
    """One Lease with resourceVersion conflicts, as the API server keeps it; ``down`` makes every call fail."""

    def __init__(self) -> None:
        self.obj: dict[str, Any] | None = None
        self.rv = 0
        self.down = False
        self.writes: list[str] = []

    def _check(self) -> None:
        if self.down:
            raise ConnectionError("API server unreachable")

    async def get(self) -> dict[str, Any] | None:
        self._check()
        return copy.deepcopy(self.obj)

    def _store(self, spec: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        self.obj = {"metadata": {"name": "l", "resourceVersion": str(self.rv)}, "spec": copy.deepcopy(spec)}
        self.writes.append(str(spec.get("holderIdentity")))
        return copy.deepcopy(self.obj)

    async def create(self, spec: dict[str, Any]) -> dict[str, Any] | None:
        self._check()
        return None if self.obj is not None else self._store(spec)

    async def replace(self, lease: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any] | None:
        self._check()
        if self.obj is None or lease["metadata"]["resourceVersion"] != self.obj["metadata"]["resourceVersion"]:
            return None
        return self._store(spec)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def electors(api: MemoryLease, clock: Clock) -> tuple[leader.Elector, leader.Elector]:
    wall = lambda: NOW + timedelta(seconds=clock.t)  # noqa: E731
    return (leader.Elector(api, "a", T, clock=clock, wall=wall), leader.Elector(api, "b", T, clock=clock, wall=wall))


def test_one_leader_a_standby_that_takes_over_only_after_the_lease_and_the_old_leader_stops_first() -> None:
    api, clock = MemoryLease(), Clock()
    a, b = electors(api, clock)

    async def scenario() -> None:
        assert await a.try_once() and a.leading()
        assert not await b.try_once()  # held: a just renewed
        for _ in range(5):  # a renews every retry period: b never gets it
            clock.t += 2
            assert await a.try_once()
            assert not await b.try_once()
        # a stops renewing (killed, paused, partitioned): b's clock starts at the last change it saw.
        last_change = clock.t
        while clock.t - last_change < T.lease:
            assert not await b.try_once()
            if clock.t - last_change >= T.renew_deadline:
                assert not a.leading(), "a must stop writing before b may start"
            clock.t += 1
        assert await b.try_once() and b.leading() and not a.leading()
        assert api.obj is not None and api.obj["spec"]["leaseTransitions"] == 1
        # a comes back (a GC pause ended): it sees b's record and does not take it back.
        assert not await a.try_once() and not a.leading()

    asyncio.run(scenario())
    assert api.writes[-1] == "b"


def test_a_released_lease_is_taken_at_the_next_try() -> None:
    api, clock = MemoryLease(), Clock()
    a, b = electors(api, clock)

    async def scenario() -> None:
        assert await a.try_once()
        assert not await b.try_once()
        await a.release()
        assert not a.leading()
        clock.t += 2
        assert await b.try_once()

    asyncio.run(scenario())


def test_keep_calls_lost_once_renewals_fail_for_the_renew_deadline_and_writes_stop_first() -> None:
    api, clock = MemoryLease(), Clock()
    lost: list[float] = []

    async def sleep(seconds: float) -> None:
        clock.t += seconds

    a = leader.Elector(api, "a", T, clock=clock, sleep=sleep)

    async def scenario() -> None:
        assert await a.try_once()
        leader.install(a)
        try:
            assert leader.may_write()
            api.down = True
            await a.keep(lambda: lost.append(clock.t))
            assert not leader.may_write()
        finally:
            leader.install(None)
        assert leader.may_write()  # no election: always

    asyncio.run(scenario())
    assert lost and 1000 + T.renew_deadline <= lost[0] <= 1000 + T.renew_deadline + T.retry

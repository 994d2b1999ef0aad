"""Leader election's decisions (table tests) and two electors over one in-memory Lease with a fake clock: who
leads, when a standby may take over, and that a leader stops writing before anyone else may start."""

from __future__ import annotations

import asyncio
import copy
import threading
import time
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
    (leader.Timing(lease=4, renew_deadline=3, retry=1), True),  # tests/integration/test_leader_election.py
    (leader.Timing(lease=15, renew_deadline=15, retry=2), False),  # two leaders for an instant
    (leader.Timing(lease=15, renew_deadline=10, retry=10), False),
    (leader.Timing(lease=15, renew_deadline=10, retry=0), False),
    (leader.Timing(lease=15.5, renew_deadline=10, retry=2), False),
    (leader.Timing(lease=15, renew_deadline=14, retry=4), False),  # client-go's rule holds; a 1 s margin does not
    (leader.Timing(lease=15, renew_deadline=6, retry=5), False),  # one try to renew: 6 <= 1.2 x 5
])
def test_timing(timing: leader.Timing, ok: bool) -> None:
    assert (timing.error() is None) is ok


def test_an_unsafe_timing_is_refused_at_start_naming_the_flags() -> None:
    from ddpjob_operator.cli.app import app
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["operator", "--leader-elect", "--lease-duration", "15", "--renew-deadline", "14",
                                      "--retry-period", "4"])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.replace("│", " ").split())  # rich wraps the message in a box
    assert "must exceed the renew deadline (14s) by at least the retry period (4s)" in said, said
    assert "--retry-period, --renew-deadline, --lease-duration" in said, said


class MemoryLease:
    """One Lease with resourceVersion conflicts, as the API server keeps it; ``down`` makes every call fail. It
    exists, held by nobody (``missing``: not created yet)."""

    def __init__(self, missing: bool = False) -> None:
        self.obj: dict[str, Any] | None = None
        self.rv = 0
        self.down = False
        self.writes: list[str] = []
        if not missing:
            self._store({"holderIdentity": None, "leaseDurationSeconds": 1})
            self.writes.clear()

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


def test_the_exit_on_a_lost_lease_is_kept_by_a_watchdog_while_the_event_loop_is_blocked() -> None:
    """The renewals fail, and the event loop is then blocked (a long synchronous call; a stopped process is the
    same to it): ``lost`` still comes at the renew deadline, from the watchdog's thread. A poll on the loop could
    not run until the loop was free again."""
    api = MemoryLease()
    timing = leader.Timing(lease=3, renew_deadline=1.0, retry=0.2)
    a = leader.Elector(api, "a", timing)
    lost = threading.Event()
    when: list[float] = []

    def on_lost() -> None:
        when.append(time.monotonic())
        lost.set()

    async def scenario() -> float:
        assert await a.try_once()
        renewed = time.monotonic()
        keeper = asyncio.create_task(a.keep(on_lost))
        await asyncio.sleep(0)  # keep arms the watchdog
        api.down = True
        lost.wait(timeout=10)  # blocks the event loop: no renewal try, no poll can run
        keeper.cancel()
        return renewed

    renewed = asyncio.run(scenario())
    assert lost.is_set(), "lost() never came while the loop was blocked"
    assert renewed + timing.renew_deadline <= when[0] <= renewed + timing.renew_deadline + 2.0


def test_a_deleted_lease_is_created_again_only_after_a_lease_duration_but_at_once_by_its_leader() -> None:
    api, clock = MemoryLease(), Clock()
    a, b = electors(api, clock)

    async def scenario() -> None:
        assert await a.try_once()
        api.obj = None  # someone deleted the Lease
        assert not await b.try_once(), "a may still write until its renew deadline"
        clock.t += T.lease - 1
        assert not await b.try_once()
        clock.t += 1
        assert await b.try_once() and b.leading()  # missing for a lease duration: a has stopped writing by now
        api.obj = None
        assert await b.try_once(), "its own Lease, deleted: the leader creates it again at once"

    asyncio.run(scenario())

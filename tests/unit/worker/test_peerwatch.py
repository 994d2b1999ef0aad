"""The peer watch's verdicts (ddpjob_worker.peerwatch) on a fake clock: a peer is dead after the budget of watched
silence, and never from a watcher that was not watching (a pause, a failed or slow read)."""

from __future__ import annotations

from typing import Any

import pytest
from ddpjob_worker import peerwatch
from ddpjob_worker.peerwatch import PeerAges, PeerWatch

pytestmark = pytest.mark.unit

BUDGET, POLL = 5.0, 1.0


def run(ages: PeerAges, reads: list[tuple[float, dict[int, int] | None]]) -> list[list[int]]:
    return [ages.observe(counters, now) for now, counters in reads]


def beats(start: float, end: float, value: Any) -> list[tuple[float, dict[int, int] | None]]:
    """One read a second from ``start`` to ``end``; ``value(t)`` gives the counters read at t."""
    out = []
    t = start
    while t <= end + 1e-9:
        out.append((t, value(t)))
        t += POLL
    return out


def test_a_peer_that_stops_beating_is_dead_after_the_budget() -> None:
    ages = PeerAges([1, 2], BUDGET, POLL, 0.0)
    # Both beat once a second until t=10; then rank 2 stops (its counter stays at 10).
    verdicts = run(ages, beats(1, 20, lambda t: {1: int(t), 2: int(min(t, 10))}))
    first = next(i for i, v in enumerate(verdicts) if v) + 1  # the read at t = i + 1
    assert first == 15 and verdicts[first - 1] == [2]
    assert all(v in ([], [2]) for v in verdicts)


@pytest.mark.parametrize(("name", "reads", "watching_again"), [
    ("a watcher paused longer than two polls starts over", [(11.0, {1: 10}), (17.0, {1: 10})], 17.0),
    ("a failed read starts over", [(11.0, {1: 10}), (12.0, None), (13.0, {1: 10})], 13.0),
])
def test_no_verdict_from_a_watcher_that_was_not_watching(name: str, reads: list[Any], watching_again: float) -> None:
    ages = PeerAges([1], BUDGET, POLL, 0.0)
    run(ages, beats(1, 10, lambda t: {1: int(t)}))
    assert run(ages, reads)[-1] == [], name
    # The budget counts from the first good read after the gap, with the grace of a peer not seen beating since
    # (2 polls): silence watched for 7 s after it is a verdict, not before.
    verdicts = run(ages, beats(watching_again + 1, watching_again + 7, lambda t: {1: 10}))
    assert verdicts[-2] == [] and verdicts[-1] == [1], (name, verdicts)


def test_after_a_store_outage_a_peer_may_reconnect_later_than_this_watch() -> None:
    """The store came back at t=20 (its counters are gone: every read is 0 at first); this watch reconnected at
    once, the peer's watch 6 s later (a connect timing out at 2 s, retried): within budget + 2 polls + a connect."""
    ages = PeerAges([1, 2], BUDGET, POLL, 0.0, reconnect=2.0)
    run(ages, beats(1, 10, lambda t: {1: int(t), 2: int(t)}))
    run(ages, [(t, None) for t in (11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0, 18.0, 19.0)])
    late = run(ages, beats(20, 31, lambda t: {1: max(0, int(t) - 25), 2: 0}))  # rank 1 beats from t=26 on
    assert all(1 not in v for v in late)
    assert late[9 - 1] == [] and late[10 - 1] == [2]  # rank 2: silent 9 s (5 + 2 + 2) after the store came back


def test_a_peer_that_never_beat_gets_two_polls_more() -> None:
    ages = PeerAges([1], BUDGET, POLL, 0.0)
    verdicts = run(ages, beats(1, 8, lambda t: {1: 0}))
    assert verdicts[4] == [] and verdicts[5] == [] and verdicts[6] == [1]  # t=5, 6: alive; t=7 = 5 + 2 polls


def test_a_counter_that_goes_back_is_a_beat() -> None:
    """A restarted store lost the counters: the first value after it is a change, not a silence."""
    ages = PeerAges([1], BUDGET, POLL, 0.0)
    run(ages, beats(1, 10, lambda t: {1: int(t)}))
    assert run(ages, beats(11, 14, lambda t: {1: int(t) - 10})) == [[], [], [], []]


class FakeStore:
    def __init__(self) -> None:
        self.data: dict[str, int] = {}
        self.down = False
        self.closed = False

    def add(self, key: str, value: int) -> int:
        if self.down:
            raise RuntimeError("Connection reset by peer")
        self.data[key] = self.data.get(key, 0) + value
        return self.data[key]

    def close(self) -> None:
        self.closed = True


def test_the_watch_beats_its_own_key_and_reads_only_its_peers() -> None:
    store, clock = FakeStore(), [0.0]
    watch = PeerWatch(lambda: store, "ddpjob.peers/run/3", 1, 3, BUDGET, clock=lambda: clock[0])
    for t in range(1, 8):
        clock[0] = float(t)
        store.add("ddpjob.peers/run/3/0", 1)  # rank 0 beats; rank 2 never does
        watch.poll_once()
    assert store.data["ddpjob.peers/run/3/1"] == 7
    assert watch.dead() == [2]
    store.down = True  # a partition: no verdict while reads fail, and the failed client is closed
    clock[0] = 8.0
    assert watch.poll_once() == [] and store.closed


@pytest.mark.parametrize(("world", "rank", "expected"), [
    (2, 0, [1]), (4, 2, [0, 1, 3]), (20, 18, [19, 0, 1]),
])
def test_who_watches_whom(world: int, rank: int, expected: list[int]) -> None:
    assert peerwatch.watched(rank, world) == expected


def test_the_poll_is_a_fifth_of_the_budget_at_most_a_second() -> None:
    assert [peerwatch.poll_seconds(b) for b in (0.5, 2, 5, 30)] == [0.2, 0.4, 1.0, 1.0]

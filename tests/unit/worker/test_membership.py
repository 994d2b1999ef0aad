"""Membership's verdict (pure): when a group that trains must re-form, from the round the store holds now and the
peers this agent's own watch finds silent."""

from __future__ import annotations

import pytest
from ddpjob_worker.membership import verdict


@pytest.mark.parametrize(("dead", "round_now", "participants", "expected"), [
    ([], 4, 3, None),  # whole
    ([], 4, 2, None),  # a peer left on purpose (its SIGTERM checkpoint first): the collectives end by themselves
    ([2], 4, 3, None),  # silent but still listed: its removal failed (store unreachable), asked again next poll
    ([2], 4, 2, "1 of the group's 3 pods are gone from rendezvous round 4 (silent: rank 2)"),
    ([1, 2], 4, 1, "2 of the group's 3 pods are gone from rendezvous round 4 (silent: rank 1, 2)"),
    ([], 5, 2, "this pod was removed from its rendezvous round 4: its peers formed round 5 without it"),
    ([1], 5, 3, "this pod was removed from its rendezvous round 4: its peers formed round 5 without it"),
])
def test_verdict(dead: list[int], round_now: int, participants: int, expected: str | None) -> None:
    assert verdict(4, 3, dead, round_now, participants) == expected


def test_a_pod_swept_from_a_round_that_goes_on_keeps_training() -> None:
    """torch's heartbeat sweep removed this pod while its keep-alive waited on a lost store (the e2e run of
    2026-11-27 restarted a healthy group for it): the same round, no silent peer, so nothing to re-form. The
    participants count is of the round without this pod."""
    assert verdict(4, 2, [], 4, 1) is None

"""Membership's verdict (pure): when a group that trains must re-form, from the round the store holds now and the
peers this agent's own watch finds silent."""

from __future__ import annotations

import pytest
from ddpjob_worker.membership import gone, verdict


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


NODES = {0: "w-0.job.ns.svc.cluster.local_1_0", 1: "w-1.job.ns.svc.cluster.local_1_0",
         2: "w-2.job.ns.svc.cluster.local_1_0"}


@pytest.mark.parametrize(("dead", "listed", "reported", "expected"), [
    ([], {0, 1, 2}, set(), []),
    ([2], {0, 1, 2}, set(), []),  # silent but still listed: nothing removed it yet
    ([2], {0, 1}, set(), [2]),  # removed (by this agent, another survivor or torch's sweep): reported
    ([2], {0, 1}, {2}, []),  # once per agent
    ([1, 2], {0}, {1}, [2]),
    ([3], {0, 1}, set(), []),  # a rank this agent never saw in its round: no name to report
])
def test_gone_peers_are_reported_whoever_removed_them(dead: list[int], listed: set[int], reported: set[int],
                                                       expected: list[int]) -> None:
    """The bench of 2026-11-27: a cut-off pod's old agent, stopped once its node was back, took its replacement
    (the same node descriptor then) out of the round; when the replacement's node was lost, the survivor's
    eviction found nothing to remove and nothing was reported, so the job waited 30 s for Kubernetes."""
    assert gone(dead, NODES, {NODES[r] for r in listed}, reported) == expected

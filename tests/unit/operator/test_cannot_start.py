"""PodsCannotStart (policies/cannot_start.py) and the waiting reason it reads (planner/observation.py)."""

from __future__ import annotations

from typing import Any

import pytest
from ddpjob_operator.planner.observation import PodView
from ddpjob_operator.planner.policies import cannot_start

pytestmark = pytest.mark.unit


def pod(name: str, waiting: str = "", kind: str = "worker", **kw: Any) -> PodView:
    return PodView(name=name, uid=name, replica_type=kind, waiting=waiting, image="my:1", **kw)


@pytest.mark.parametrize(("pods", "blocked", "reason", "words"), [
    pytest.param([pod("j-worker-0", "ContainerCreating"), pod("j-rdzv", "", "rendezvous")], False, "Starting", "",
                 id="starting-normally"),
    pytest.param([pod("j-worker-0", "ImagePullBackOff: Back-off pulling image \"my:1\"")], True, "ImagePullBackOff",
                 "j-worker-0 cannot start (worker image my:1): ImagePullBackOff: Back-off pulling image", id="pull"),
    pytest.param([pod("j-worker-0", "ErrImagePull: not found"), pod("j-rdzv", "CrashLoopBackOff: back-off 40s",
                                                                    "rendezvous")],
                 True, "CrashLoopBackOff", "j-rdzv cannot start (the rendezvous store): CrashLoopBackOff: back-off "
                 "40s (1 more pod(s) blocked)", id="rendezvous-named-first"),
    pytest.param([pod("j-worker-0", "Unschedulable: 0/3 nodes")], False, "Starting", "", id="unschedulable-is-queued"),
    pytest.param([pod("j-worker-0", "ErrImagePull: x", deletion_timestamp=None, gone=True)], False, "Starting", "",
                 id="gone-pods-ignored"),
])
def test_cannot_start(pods: list[PodView], blocked: bool, reason: str, words: str) -> None:
    found = cannot_start.decide(pods)
    assert (found.blocked, found.reason) == (blocked, reason)
    assert words in found.message


def test_an_init_container_that_cannot_pull_is_the_pods_reason() -> None:
    body = {"metadata": {"name": "j-worker-0", "uid": "u"}, "spec": {"containers": [{"name": "worker", "image": "a"}]},
            "status": {"phase": "Pending",
                       "initContainerStatuses": [{"name": "ddpjob-runtime", "state": {"waiting": {
                           "reason": "ImagePullBackOff", "message": "Back-off pulling image \"ddpjob-runtime:9\""}}}],
                       "containerStatuses": [{"name": "worker", "state": {"waiting": {"reason": "PodInitializing"}}}]}}
    view = PodView.from_pod(body)
    assert view.waiting.startswith("ImagePullBackOff: Back-off pulling image \"ddpjob-runtime:9\"")
    assert cannot_start.decide([view]).blocked


def test_a_long_kubelet_message_keeps_its_reason() -> None:
    """A failed pull's message runs to hundreds of characters; cutting it must not cut the reason the policies
    read (seen on the real node: PodsCannotStart stayed False)."""
    long = "Back-off pulling image \"rt:no\": ErrImagePull: failed to pull and unpack image " + "x" * 400
    body = {"metadata": {"name": "j-rdzv", "uid": "u", "labels": {"ddpjob.io/replica-type": "rendezvous"}},
            "spec": {"containers": [{"name": "rendezvous", "image": "rt:no"}]},
            "status": {"phase": "Pending", "containerStatuses": [
                {"name": "rendezvous", "state": {"waiting": {"reason": "ImagePullBackOff", "message": long}}}]}}
    view = PodView.from_pod(body)
    assert view.waiting.startswith("ImagePullBackOff: ...") and len(view.waiting) <= 300
    assert cannot_start.decide([view]).blocked

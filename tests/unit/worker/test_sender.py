"""The status sender: patches go out from its own thread, merged while one is in flight, none lost."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest
from ddpjob_worker.sender import Sender, merged


@pytest.mark.parametrize(("old", "new", "want"), [
    ({}, {"a": 1}, {"a": 1}),
    ({"a": 1, "b": 2}, {"a": 3}, {"a": 3, "b": 2}),
    # nested objects merge, as the API server merges a JSON merge patch: an announcement's start record
    # does not erase the first-step time of a report still waiting
    ({"start": {"restartCount": 1, "firstStepTime": "t1"}, "globalStep": 5},
     {"start": {"restartCount": 2, "rendezvousTime": "t0"}},
     {"start": {"restartCount": 2, "firstStepTime": "t1", "rendezvousTime": "t0"}, "globalStep": 5}),
    ({"lastCheckpoint": {"step": 4}}, {"lastCheckpoint": 7}, {"lastCheckpoint": 7}),  # a value replaces an object
])
def test_merged_is_what_the_server_holds_after_both(old: dict[str, Any], new: dict[str, Any],
                                                    want: dict[str, Any]) -> None:
    assert merged(old, new) == want
    assert old == merged(old, {})  # old itself untouched


def test_submit_never_waits_and_the_latest_wins_while_a_send_is_in_flight() -> None:
    release, started = threading.Event(), threading.Event()
    sent: list[Mapping[str, Any]] = []

    def send(patch: Mapping[str, Any]) -> None:
        started.set()
        release.wait(10)  # the API server holds the first request
        sent.append(patch)

    sender = Sender(send)
    t0 = time.monotonic()
    sender.submit({"globalStep": 1})
    assert started.wait(5)
    for step in range(2, 101):
        sender.submit({"globalStep": step, "epoch": step // 10})
    assert time.monotonic() - t0 < 1
    assert not sender.drain(0.1)  # still in flight
    release.set()
    assert sender.drain(5)
    assert sent == [{"globalStep": 1}, {"globalStep": 100, "epoch": 10}]

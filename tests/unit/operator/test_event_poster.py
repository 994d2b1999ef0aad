"""The controller's Event poster (kube/events.py): the passes' Events go out in the background, in order for each
object, at most ``limit`` at once, through kopf's post_event (fenced by leader election); an error is logged and
the next Event still goes."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest
from ddpjob_operator.kube import events
from ddpjob_operator.kube.kopf_compat import kopf_events


def job(name: str) -> dict[str, Any]:
    return {"apiVersion": "ddpjob.io/v1alpha1", "kind": "DDPJob",
            "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"}}


def test_events_go_in_order_per_object_and_bounded_at_once(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    posted: list[tuple[str, str]] = []
    in_flight, peak = 0, 0

    async def post_event(*, ref: dict[str, Any], type: str, reason: str, message: str, resource: Any,
                         settings: Any, logger: Any) -> None:
        nonlocal in_flight, peak
        assert resource is events.EVENTS and ref["uid"] == f"uid-{ref['name']}"
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        if reason == "Broken":
            raise TimeoutError("the API server did not answer")
        posted.append((ref["name"], reason))

    monkeypatch.setattr(kopf_events, "post_event", post_event)

    async def scenario() -> None:
        poster = events.Poster(kopf.OperatorSettings(), limit=3)
        for i in range(8):
            for reason in ("First", "Broken", "Second"):
                poster.post(job(f"j{i}"), "Normal", reason, "m")
        while poster._tasks:
            await asyncio.sleep(0.01)
        await poster.close()

    asyncio.run(scenario())
    assert peak == 3
    for i in range(8):
        assert [r for n, r in posted if n == f"j{i}"] == ["First", "Second"]
    assert "Event Broken of ns/j0 not posted" in caplog.text


def test_close_cancels_what_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    async def post_event(**_: Any) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(kopf_events, "post_event", post_event)

    async def scenario() -> None:
        poster = events.Poster(kopf.OperatorSettings())
        poster.post(job("j"), "Warning", "R", "m")
        await asyncio.sleep(0.01)
        await asyncio.wait_for(poster.close(), 1)
        assert not poster._tasks and not poster._waiting

    asyncio.run(scenario())

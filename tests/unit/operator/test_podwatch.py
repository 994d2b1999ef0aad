"""The pods' own stream (podwatch.py) over a scripted kopf stream: events reach the sink with kopf's types, kopf's
LISTED marker and the API server's bookmarks do not, and a failed stream starts again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import kopf
import pytest
from ddpjob_operator.kube import podwatch
from ddpjob_operator.kube.kopf_compat import kopf_watching as watching


def test_events_reach_the_sink_and_a_failed_stream_starts_again(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str | None, object]] = []
    seen: list[tuple[str | None, str]] = []
    done = asyncio.Event()

    async def stream(*, settings: Any, resource: Any, namespace: str | None) -> AsyncIterator[Any]:
        calls.append((namespace, resource))
        if len(calls) == 1:
            yield {"type": None, "object": {"metadata": {"name": "listed"}}}
            yield watching.Bookmark.LISTED
            yield {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}
            yield {"type": "MODIFIED", "object": {"metadata": {"name": "changed"}}}
            raise ConnectionError("the API server went away")
        yield {"type": "DELETED", "object": {"metadata": {"name": "gone"}}}
        done.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(watching, "infinite_watch", stream)
    monkeypatch.setattr(podwatch, "MAX_RETRY_SECONDS", 0.01)

    async def scenario() -> None:
        task = asyncio.create_task(podwatch.watch_pods(kopf.OperatorSettings(), ["ns"],
                                                       lambda t, obj: seen.append((t, obj["metadata"]["name"]))))
        await asyncio.wait_for(done.wait(), 5)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
    assert seen == [(None, "listed"), ("MODIFIED", "changed"), ("DELETED", "gone")]
    assert [ns for ns, _ in calls] == ["ns", "ns"] and calls[0][1] is podwatch.PODS


def test_one_cluster_wide_stream_without_namespaces(monkeypatch: pytest.MonkeyPatch) -> None:
    scopes: list[str | None] = []

    async def stream(*, settings: Any, resource: Any, namespace: str | None) -> AsyncIterator[Any]:
        scopes.append(namespace)
        await asyncio.Event().wait()
        yield {}

    monkeypatch.setattr(watching, "infinite_watch", stream)

    async def scenario(namespaces: list[str]) -> None:
        task = asyncio.create_task(podwatch.watch_pods(kopf.OperatorSettings(), namespaces, lambda t, o: None))
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario([]))
    asyncio.run(scenario(["a", "b"]))
    assert scopes == [None, "a", "b"]

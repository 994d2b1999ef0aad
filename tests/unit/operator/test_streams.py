"""The controller's own streams of pods and DDPJobs (streams.py) over a scripted kopf stream: events reach the
sink with kopf's types, kopf's LISTED marker and the API server's bookmarks do not, and a failed stream starts again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import kopf
import pytest
from ddpjob_operator.kube import streams
from ddpjob_operator.kube.kopf_compat import kopf_references as references
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
    monkeypatch.setattr(streams, "MAX_RETRY_SECONDS", 0.01)

    async def scenario() -> None:
        task = asyncio.create_task(streams.watch(kopf.OperatorSettings(), streams.PODS, ["ns"],
                                                  lambda t, obj: seen.append((t, obj["metadata"]["name"]))))
        await asyncio.wait_for(done.wait(), 5)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
    assert seen == [(None, "listed"), ("MODIFIED", "changed"), ("DELETED", "gone")]
    assert [ns for ns, _ in calls] == ["ns", "ns"] and calls[0][1] is streams.PODS


def test_one_cluster_wide_stream_without_namespaces(monkeypatch: pytest.MonkeyPatch) -> None:
    scopes: list[str | None] = []

    async def stream(*, settings: Any, resource: Any, namespace: str | None) -> AsyncIterator[Any]:
        scopes.append(namespace)
        await asyncio.Event().wait()
        yield {}

    monkeypatch.setattr(watching, "infinite_watch", stream)

    async def scenario(namespaces: list[str]) -> None:
        watching_jobs = streams.watch(kopf.OperatorSettings(), streams.DDPJOBS, namespaces, lambda t, o: None)
        task = asyncio.create_task(watching_jobs)
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario([]))
    asyncio.run(scenario(["a", "b"]))
    assert scopes == [None, "a", "b"]


def test_a_sink_error_is_logged_and_the_stream_goes_on(monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A bug in the controller's handling of one object must not restart the stream (a re-list of everything that
    meets the same object again): the next events still arrive, on the same stream."""
    calls: list[object] = []
    seen: list[str] = []
    done = asyncio.Event()

    async def stream(*, settings: Any, resource: Any, namespace: str | None) -> AsyncIterator[Any]:
        calls.append(resource)
        yield {"type": "MODIFIED", "object": {"metadata": {"namespace": "ns", "name": "bad"}}}
        yield {"type": "MODIFIED", "object": {"metadata": {"namespace": "ns", "name": "good"}}}
        done.set()
        await asyncio.Event().wait()

    def sink(_: str | None, obj: Any) -> None:
        if obj["metadata"]["name"] == "bad":
            raise KeyError("spec")
        seen.append(obj["metadata"]["name"])

    monkeypatch.setattr(watching, "infinite_watch", stream)

    async def scenario() -> None:
        task = asyncio.create_task(streams.watch(kopf.OperatorSettings(), streams.DDPJOBS, ["ns"], sink))
        await asyncio.wait_for(done.wait(), 5)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
    assert seen == ["good"] and calls == [streams.DDPJOBS]
    assert "DDPJob ns/bad: its MODIFIED event was not taken in" in caplog.text


def test_the_ddpjob_stream_watches_the_crd_that_is_installed() -> None:
    from ddpjob_operator.api.spec import API_VERSION

    assert f"{streams.DDPJOBS.group}/{streams.DDPJOBS.version}" == API_VERSION
    url = streams.DDPJOBS.get_url(namespace=references.NamespaceName("ns"))
    assert url == "/apis/ddpjob.io/v1alpha1/namespaces/ns/ddpjobs"

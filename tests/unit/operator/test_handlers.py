"""The kopf wiring: only event handlers (so kopf's diff base may stay unbuilt), and bounds on what kopf and the API
layer hold at once."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import kopf
import pytest
from ddpjob_operator.kube import client as kube
from ddpjob_operator.kube import streams
from ddpjob_operator.kube.kopf_compat import kopf_api
from ddpjob_operator.runtime import handlers


def test_only_event_handlers_are_registered_so_no_diff_base_is_needed() -> None:
    registry = kopf.get_default_registry()
    watched = {getattr(h.fn, "__name__", "") for h in registry._watching.get_all_handlers()}
    assert {"service_event", "identity_event"} <= watched
    assert "pod_event" not in watched, "pods come from the controller's own stream (streams.py)"
    assert "ddpjob_event" not in watched, "DDPJobs come from the controller's own stream (streams.py)"
    assert not registry._changing.get_all_handlers(), "on.create/update/field handlers need kopf's diff base"
    assert not registry._spawning.get_all_handlers(), "daemons and timers need kopf's diff base"


def test_the_controller_starts_at_kopfs_startup_after_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """No DDPJob handler starts it any more (the jobs come from its own stream): kopf's startup does, after
    configure has set the label selectors the streams list with."""
    registry = kopf.get_default_registry()
    startup = [h.fn for h in registry._activities.get_all_handlers() if getattr(h.activity, "value", "") == "startup"]
    assert startup.index(handlers.configure) < startup.index(handlers.start)
    started: list[kube.Kube] = []
    monkeypatch.setattr(handlers.controller, "start", started.append)
    settings = kopf.OperatorSettings()
    asyncio.run(cast(Any, handlers.start)(settings=settings))
    assert len(started) == 1 and started[0].settings is settings


def test_the_diff_base_is_empty_whatever_the_object() -> None:
    body = kopf.Body({"metadata": {"name": "p", "labels": {"a": "b"}}, "spec": {"x": 1}, "status": {"y": 2}})
    assert handlers.EventHandlersOnly().build(body=body) == {}


def test_settings_bound_what_kopf_holds_at_once() -> None:
    settings = kopf.OperatorSettings()
    asyncio.run(cast(Any, handlers.configure)(settings=settings))  # kopf's decorator hides the signature
    assert settings.watching.chunk_size == kube.LIST_PAGE, "kopf's re-lists come in pages"
    assert settings.queueing.idle_timeout == handlers.IDLE_WORKER_SECONDS
    assert settings.posting.worker_limit == handlers.EVENT_POSTERS
    assert isinstance(settings.persistence.diffbase_storage, handlers.EventHandlersOnly)
    # The pods' own stream is filtered by the API server like kopf's were.
    assert settings.watching.label_selectors.collect(streams.PODS) == ["ddpjob.io/job-name"]
    assert settings.watching.label_selectors.collect(
        kopf.Resource("rbac.authorization.k8s.io", "v1", "roles")) == ["app.kubernetes.io/component=worker-identity"]


def test_requests_in_flight_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    in_flight, peak = 0, 0

    class Response:
        status = 200

        async def __aenter__(self) -> Response:
            return self

        async def __aexit__(self, *_: object) -> None:
            return None

        async def text(self) -> str:
            return "{}"

    async def request(*_: object, **__: object) -> Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return Response()

    async def scenario() -> None:
        api = kube.Kube(kopf.OperatorSettings(), logging.getLogger("test"))
        await asyncio.gather(*(api.get("v1", "Pod", "ns", f"p{i}") for i in range(3 * kube.MAX_IN_FLIGHT)))

    monkeypatch.setattr(kopf_api, "request", request)
    asyncio.run(scenario())
    assert peak == kube.MAX_IN_FLIGHT

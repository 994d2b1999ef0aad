"""The leader's fence on every write (kube/client.py, kube/leader.py, issue 43 #5): asked last, after the wait for a
slot and for the rate limit, and again before each retry; the status write conditional on the body it was planned
from; and no Event from a replica that is not the leader."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
import pytest
from ddpjob_operator.kube import kopf_compat, leader, ratelimit
from ddpjob_operator.kube.client import Kube, StatusConflict
from ddpjob_operator.kube.kopf_compat import kopf_api, kopf_errors

pytestmark = pytest.mark.unit


class Lease:
    """An elector stand-in whose leadership the test turns off."""

    def __init__(self) -> None:
        self.held = True

    def leading(self) -> bool:
        return self.held


class Response:
    status = 200

    async def __aenter__(self) -> Response:
        return self

    async def __aexit__(self, *_: object) -> None:
        return None

    async def text(self) -> str:
        return '{"metadata": {"resourceVersion": "8"}}'


@pytest.fixture
def lease() -> Any:
    held = Lease()
    leader.install(held)  # type: ignore[arg-type]
    yield held
    leader.install(None)


def kube() -> Kube:
    return Kube(kopf.OperatorSettings(), logging.getLogger("test"))


def test_a_write_that_waited_for_the_rate_limit_past_the_lease_is_never_sent(
        lease: Lease, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lease is lost while the write waits for its turn (1 request/s, the token just taken): asked before the
    wait, the fence let it through and it went out after another replica could have taken over."""
    sent: list[str] = []

    async def request(method: str, url: str, **_: object) -> Response:
        sent.append(method)
        return Response()

    monkeypatch.setattr(kopf_api, "request", request)
    api = kube()
    api._bucket = ratelimit.TokenBucket(qps=1.0, burst=1)

    async def scenario() -> None:
        await api.get("v1", "Pod", "ns", "p")  # takes the only token
        write = asyncio.create_task(api.delete_pod("ns", "p", "uid-1", force=False))
        await asyncio.sleep(0.3)  # waiting for the next token
        lease.held = False
        with pytest.raises(kopf.TemporaryError, match="not the leader"):
            await write

    asyncio.run(scenario())
    assert sent == ["get"]


def test_each_retry_of_a_write_asks_the_fence_again(lease: Lease, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write retried after a 5xx goes out again only while this replica leads (kopf's retries inside a call
    never asked)."""
    sent: list[str] = []

    async def request(method: str, url: str, **kw: object) -> Response:
        sent.append(method)
        assert kw["backoffs"] == (), "a write's retries are this client's, each one fenced"
        lease.held = False  # lost while the first attempt was refused
        raise kopf_errors.APIServerError("etcd leader changed", status=500, headers={})

    monkeypatch.setattr(kopf_api, "request", request)
    with pytest.raises(kopf.TemporaryError, match="not the leader"):
        asyncio.run(kube().delete_pod("ns", "p", "uid-1", force=False))
    assert sent == ["delete"]


def test_the_status_write_is_conditional_on_the_body_it_was_planned_from(
        lease: Lease, monkeypatch: pytest.MonkeyPatch) -> None:
    payloads: list[Any] = []

    async def request(method: str, url: str, payload: Any = None, **_: object) -> Response:
        payloads.append(payload)
        if len(payloads) > 1:
            raise kopf_errors.APIConflictError("the object has been modified", status=409, headers={})
        return Response()

    monkeypatch.setattr(kopf_api, "request", request)
    api = kube()
    asyncio.run(api.patch_status("ns", "j", {"incidentCount": 2}, "7"))
    assert payloads[0] == {"metadata": {"resourceVersion": "7"}, "status": {"incidentCount": 2}}
    with pytest.raises(StatusConflict):
        asyncio.run(api.patch_status("ns", "j", {"incidentCount": 2}, "7"))


def test_no_event_from_a_replica_that_is_not_the_leader(lease: Lease, monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf posts the controller's Events and its own log lines as Events from a queue of its own, past this
    client: the fence is on its poster too (kopf_compat.fence_events), asked as each Event is sent."""
    posted: list[str] = []

    async def post(**kw: Any) -> None:
        posted.append(kw["reason"])

    monkeypatch.setattr(kopf_compat.kopf_events, "post_event", post)
    kopf_compat.fence_events(leader.may_write)
    event: dict[str, Any] = {"ref": {"kind": "DDPJob", "name": "j", "namespace": "ns"}, "type": "Normal",
                             "message": "m", "resource": None, "settings": kopf.OperatorSettings(),
                             "logger": logging.getLogger("test")}
    asyncio.run(kopf_compat.kopf_events.post_event(reason="Leading", **event))
    lease.held = False
    asyncio.run(kopf_compat.kopf_events.post_event(reason="Deposed", **event))
    assert posted == ["Leading"]


def test_the_controllers_event_poster_is_fenced_too(lease: Lease, monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller posts its Events itself (kube/events.py), through kopf's post_event as fenced."""
    from ddpjob_operator.kube import events

    posted: list[str] = []

    async def post(**kw: Any) -> None:
        posted.append(kw["reason"])

    monkeypatch.setattr(kopf_compat.kopf_events, "post_event", post)
    kopf_compat.fence_events(leader.may_write)
    job = {"apiVersion": "ddpjob.io/v1alpha1", "kind": "DDPJob", "metadata": {"name": "j", "namespace": "ns"}}

    async def scenario() -> None:
        poster = events.Poster(kopf.OperatorSettings())
        poster.post(job, "Normal", "Leading", "m")
        await asyncio.sleep(0.05)
        lease.held = False
        poster.post(job, "Normal", "Deposed", "m")
        await asyncio.sleep(0.05)
        await poster.close()

    asyncio.run(scenario())
    assert posted == ["Leading"]

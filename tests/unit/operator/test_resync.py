"""The resync reads every LIST page by page: children become views, DDPJob bodies go to the controller."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import pytest
from ddpjob_operator.api.spec import KIND
from ddpjob_operator.kube.client import Kube
from ddpjob_operator.kube.kopf_compat import kopf_errors
from ddpjob_operator.runtime import controller as ctl
from ddpjob_operator.runtime import resync
from ddpjob_operator.runtime.cache import ChildCache

from .factories import make_job, pod_obj


class PagedKube:
    """Answers LISTs in pages of one object: pods of one job, one DDPJob; every other kind is empty."""

    def __init__(self, pods: list[dict[str, Any]], jobs: list[dict[str, Any]]) -> None:
        self.by_kind = {"Pod": pods, KIND: jobs}
        self.pages_read = 0
        self.full_pod_lists: list[str] = []  # the label selectors of LISTs of whole pods

    async def pages(self, api_version: str, kind: str, namespace: str | None, label_selector: str, *,
                    metadata_only: bool = False) -> AsyncIterator[list[dict[str, Any]]]:
        if kind == "Pod" and not metadata_only:
            self.full_pod_lists.append(label_selector)
        for obj in self.by_kind.get(kind, []):
            label, _, value = label_selector.partition("=")
            if value and obj["metadata"].get("labels", {}).get(label) != value:
                continue
            self.pages_read += 1
            yield [metadata(obj) if metadata_only else obj]


def metadata(obj: dict[str, Any]) -> dict[str, Any]:
    """The object as a PartialObjectMetadataList item."""
    return {"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": obj["metadata"]}


def test_resync_takes_every_page_and_forgets_jobs_the_list_lacks() -> None:
    job, gone = make_job("job").obj(), make_job("gone").obj()
    job["metadata"]["resourceVersion"] = gone["metadata"]["resourceVersion"] = "5"
    pods = [pod_obj(job, i) for i in range(3)]
    kube = PagedKube(pods, [job])
    cache, c = ChildCache(), ctl.Controller()
    c.job_seen(None, gone)
    changed = asyncio.run(resync.resync_once(cast(Kube, kube), cache, c, ["ns"]))
    assert kube.pages_read == 7, "three metadata pages, the job's three pods in full (none held), one DDPJob page"
    assert kube.full_pod_lists == ["ddpjob.io/job-name=job"], "the full pods of that job only"
    assert changed == (1, 4), "one job's children changed; three pods and one DDPJob listed"
    assert sorted(p.name for p in cache.pods(("ns", "job"))) == sorted(p["metadata"]["name"] for p in pods)
    assert set(c.jobs) == {("ns", "job")}, "learnt from its page; 'gone' was not listed"


class NamespacedKube:
    """Each watched namespace's LIST answered in turn: namespace "a" is listed before the pod "late" is created
    there, and the watch delivers that pod while namespace "b" is listed."""

    def __init__(self, listed: dict[str, list[dict[str, Any]]], jobs: list[dict[str, Any]],
                 between: Callable[[], object]) -> None:
        self.listed, self.jobs, self.between = listed, jobs, between

    async def pages(self, api_version: str, kind: str, namespace: str | None, label_selector: str, *,
                    metadata_only: bool = False) -> AsyncIterator[list[dict[str, Any]]]:
        assert namespace is not None
        if kind == "Pod" and namespace == "b" and metadata_only:
            self.between()
        objs = self.listed.get(namespace, []) if kind == "Pod" else [
            j for j in self.jobs if j["metadata"]["namespace"] == namespace] if kind == KIND else []
        yield objs


def test_a_pod_created_after_its_namespaces_list_is_not_taken_for_deleted() -> None:
    """Issue 23 #2: the largest resourceVersion of all namespaces' LISTs was every namespace's cut-off; now each
    namespace's LIST is judged from the mark taken right before it, and resourceVersions are never compared."""
    a, b = make_job("a", namespace="a").obj(), make_job("b", namespace="b").obj()
    a["metadata"]["resourceVersion"], b["metadata"]["resourceVersion"] = "opaque-a", "opaque-b"
    late = pod_obj(a, 0)
    late["metadata"]["resourceVersion"] = "opaque-late"
    cache, c = ChildCache(), ctl.Controller()
    kube = NamespacedKube({"a": [], "b": [pod_obj(b, 0)]}, [a, b], lambda: cache.apply("Pod", "ADDED", late))
    asyncio.run(resync.resync_once(cast(Kube, kube), cache, c, ["a", "b"]))
    live = [p.name for p in cache.pods(("a", "a")) if not p.gone]
    assert live == [late["metadata"]["name"]], "a live pod was taken for deleted (a false incident, a replacement)"
    assert set(c.jobs) == {("a", "a"), ("b", "b")}


def test_pods_the_cache_holds_at_the_listed_version_are_listed_by_their_metadata_alone() -> None:
    """Issue 46: decoding every pod in full each resync was most of an idle operator's CPU. Pods held at the listed
    resourceVersion cost their metadata only; a job with a pod at another version (a missed event) is listed in
    full, that job alone; too many such jobs, one full LIST."""
    jobs = [make_job(f"j{i}").obj() for i in range(3)]
    pods = [pod_obj(j, 0) for j in jobs]
    for i, pod in enumerate(pods):
        pod["metadata"]["resourceVersion"] = f"v{i}"
    kube, cache, c = PagedKube(pods, jobs), ChildCache(), ctl.Controller()
    for pod in pods:
        cache.apply("Pod", "ADDED", pod)
    assert asyncio.run(resync.resync_once(cast(Kube, kube), cache, c, ["ns"])).changed == 0
    assert kube.full_pod_lists == []
    changed = copy.deepcopy(pods[1])
    changed["metadata"]["resourceVersion"] = "v9"
    changed["status"]["phase"] = "Failed"  # missed by the watch
    kube.by_kind["Pod"] = [pods[0], changed, pods[2]]
    assert asyncio.run(resync.resync_once(cast(Kube, kube), cache, c, ["ns"])).changed == 1
    assert kube.full_pod_lists == ["ddpjob.io/job-name=j1"]
    assert cache.pod(("ns", "j1"), changed["metadata"]["uid"]).phase == "Failed"  # type: ignore[union-attr]
    kube.full_pod_lists.clear()
    kube.by_kind["Pod"] = [dict(p, metadata={**p["metadata"], "resourceVersion": "new"}) for p in pods]
    resync.FULL_LIST_OVER, saved = 1, resync.FULL_LIST_OVER
    try:
        asyncio.run(resync.resync_once(cast(Kube, kube), cache, c, ["ns"]))
    finally:
        resync.FULL_LIST_OVER = saved
    assert kube.full_pod_lists == ["ddpjob.io/job-name"], "three jobs over the limit: one LIST of every pod"


def test_a_pod_the_watch_delivers_within_the_grace_is_not_listed_in_full() -> None:
    """Issue 46: while jobs start, their pods change faster than a resync lists them, and the watch, a moment
    behind, delivers what the LIST showed; a full LIST of every pod then cost 4 % of the operator's CPU. A periodic
    resync gives the watch STALE_GRACE_SECONDS: pods the cache then holds at the listed version or a newer one (an
    etcd-backed API server's versions are integers) are not fetched; a pod still behind is."""
    jobs = [make_job(f"j{i}").obj() for i in range(3)]
    pods = [pod_obj(j, 0) for j in jobs]
    for pod in pods:
        pod["metadata"]["resourceVersion"] = "10"
    kube, cache, c = PagedKube(pods, jobs), ChildCache(), ctl.Controller()
    for pod in pods:
        cache.apply("Pod", "ADDED", pod)
    newer = copy.deepcopy(pods[0])
    newer["metadata"]["resourceVersion"] = "12"  # the cache is ahead of the LIST: nothing missed
    cache.apply("Pod", "MODIFIED", newer)
    listed = [copy.deepcopy(p) for p in pods]
    listed[1]["metadata"]["resourceVersion"] = listed[2]["metadata"]["resourceVersion"] = "11"
    listed[1]["status"]["phase"] = listed[2]["status"]["phase"] = "Running"
    kube.by_kind["Pod"] = listed

    async def scenario() -> None:
        async def the_watch() -> None:  # j1's change arrives during the grace; j2's never does (missed)
            await asyncio.sleep(0.01)
            cache.apply("Pod", "MODIFIED", listed[1])

        watch = asyncio.create_task(the_watch())
        await resync.resync_once(cast(Kube, kube), cache, c, ["ns"], grace=0.1)
        await watch

    asyncio.run(scenario())
    assert kube.full_pod_lists == ["ddpjob.io/job-name=j2"]
    assert cache.pod(("ns", "j2"), listed[2]["metadata"]["uid"]).phase == "Running"  # type: ignore[union-attr]
    assert cache.pod(("ns", "j0"), newer["metadata"]["uid"]).resource_version == "12"  # type: ignore[union-attr]
    kube.full_pod_lists.clear()
    listed[2]["metadata"]["resourceVersion"] = "13"
    asyncio.run(resync.resync_once(cast(Kube, kube), cache, c, ["ns"]))  # the initial sync: no grace, no wait
    assert kube.full_pod_lists == ["ddpjob.io/job-name=j2"]


class ExpiringKube(PagedKube):
    """The first LIST of each kind in ``expire`` fails after its first page: its continue token outlived the API
    server's compaction (410)."""

    def __init__(self, pods: list[dict[str, Any]], jobs: list[dict[str, Any]], expire: set[str]) -> None:
        super().__init__(pods, jobs)
        self.expire = set(expire)

    async def pages(self, api_version: str, kind: str, namespace: str | None, label_selector: str, *,
                    metadata_only: bool = False) -> AsyncIterator[list[dict[str, Any]]]:
        n = 0
        async for page in super().pages(api_version, kind, namespace, label_selector, metadata_only=metadata_only):
            if n == 1 and kind in self.expire:
                self.expire.discard(kind)
                raise kopf_errors.APIClientError("The provided continue parameter is too old",
                                                 status=410, headers={})
            n += 1
            yield page


def test_a_list_continued_past_the_compaction_is_listed_again_at_once() -> None:
    """At 45,000 starting pods a resync's paged LIST outlived the API server's compaction and the resync waited a
    whole period; now the kind is listed again from its first page, in the same resync."""
    jobs = [make_job(f"j{i}").obj() for i in range(3)]
    pods = [pod_obj(j, i) for j in jobs for i in range(2)]
    kube, cache, c = ExpiringKube(pods, jobs, {"Pod", KIND}), ChildCache(), ctl.Controller()
    asyncio.run(resync.resync_once(cast(Kube, kube), cache, c, ["ns"]))
    assert kube.expire == set(), "both LISTs expired once"
    assert all(len([p for p in cache.pods(("ns", f"j{i}")) if not p.gone]) == 2 for i in range(3))
    assert set(c.jobs) == {("ns", "j0"), ("ns", "j1"), ("ns", "j2")}
    forbidden = ExpiringKube(pods, jobs, set())

    async def refuse(*args: Any, **kwargs: Any) -> AsyncIterator[list[dict[str, Any]]]:
        raise kopf_errors.APIClientError("bad request", status=400, headers={})
        yield []

    forbidden.pages = refuse  # type: ignore[method-assign]
    try:
        asyncio.run(resync.resync_once(cast(Kube, forbidden), ChildCache(), ctl.Controller(), ["ns"]))
    except kopf_errors.APIClientError as err:
        assert err.status == 400, "another client error is not listed again"
    else:
        raise AssertionError("a 400 must end the resync (the next period tries again)")


@pytest.mark.parametrize(("period", "listed", "wait"), [
    (60.0, 0, 60.0),
    (60.0, 12_000, 60.0),  # 1,000 jobs x 8 workers and their Services and NetworkPolicies: the period holds
    (60.0, 60_000, 300.0),  # 5,000 such jobs: every 5 min
    (5.0, 3_000, 15.0),
    (600.0, 60_000, 600.0),  # a longer period than the bound asks for stays
])
def test_the_period_stretches_with_the_objects_listed(period: float, listed: int, wait: float) -> None:
    assert resync.next_wait(period, listed) == wait


def test_resync_forever_waits_by_what_the_last_resync_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wait after each resync follows next_wait of its count; a failed resync keeps the last wait."""
    answers: list[Any] = [resync.Resynced(0, 100), resync.Resynced(2, 60_000), RuntimeError("503"),
                          resync.Resynced(0, 100)]
    waits: list[float] = []

    async def once(*args: Any, **kwargs: Any) -> resync.Resynced:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return cast(resync.Resynced, answer)

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        if not answers:
            raise asyncio.CancelledError

    monkeypatch.setattr(resync, "resync_once", once)
    monkeypatch.setattr(asyncio, "sleep", sleep)  # resync_forever waits with asyncio.sleep
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(resync.resync_forever(cast(Kube, None), ChildCache(), ctl.Controller(), ["ns"], 60.0))
    assert waits == [60.0, 60.0, 300.0, 300.0, 60.0]

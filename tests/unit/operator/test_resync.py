"""The resync reads every LIST page by page: children become views, DDPJob bodies go to the controller."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

from ddpjob_operator.api.spec import KIND
from ddpjob_operator.kube.client import Kube
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
    assert changed == 1
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
    assert asyncio.run(resync.resync_once(cast(Kube, kube), cache, c, ["ns"])) == 0
    assert kube.full_pod_lists == []
    changed = copy.deepcopy(pods[1])
    changed["metadata"]["resourceVersion"] = "v9"
    changed["status"]["phase"] = "Failed"  # missed by the watch
    kube.by_kind["Pod"] = [pods[0], changed, pods[2]]
    assert asyncio.run(resync.resync_once(cast(Kube, kube), cache, c, ["ns"])) == 1
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

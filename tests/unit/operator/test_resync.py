"""The resync reads every LIST page by page: children become views, DDPJob bodies go to the controller."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

from ddpjob_operator import controller as ctl
from ddpjob_operator import resync
from ddpjob_operator.cache import ChildCache
from ddpjob_operator.kube import Kube
from ddpjob_operator.spec import KIND

from .factories import make_job, pod_obj


class PagedKube:
    """Answers LISTs in pages of one object: pods of one job, one DDPJob; every other kind is empty."""

    def __init__(self, pods: list[dict[str, Any]], jobs: list[dict[str, Any]]) -> None:
        self.by_kind = {"Pod": pods, KIND: jobs}
        self.pages_read = 0

    async def pages(self, api_version: str, kind: str, namespace: str | None,
                    label_selector: str) -> AsyncIterator[tuple[list[dict[str, Any]], int]]:
        for obj in self.by_kind.get(kind, []):
            self.pages_read += 1
            yield [obj], 100


def test_resync_takes_every_page_and_forgets_jobs_the_list_lacks() -> None:
    job, gone = make_job("job").obj(), make_job("gone").obj()
    job["metadata"]["resourceVersion"] = gone["metadata"]["resourceVersion"] = "5"
    pods = [pod_obj(job, i) for i in range(3)]
    kube = PagedKube(pods, [job])
    cache, c = ChildCache(), ctl.Controller()
    c.job_seen(None, gone)
    changed = asyncio.run(resync.resync_once(cast(Kube, kube), cache, c, ["ns"]))
    assert kube.pages_read == 4, "three pod pages and one DDPJob page"
    assert changed == 1
    assert sorted(p.name for p in cache.pods(("ns", "job"))) == sorted(p["metadata"]["name"] for p in pods)
    assert set(c.jobs) == {("ns", "job")}, "learnt from its page; 'gone' was not listed"

"""The keyed work queue: deduplication, re-queue while in work, delayed adds."""

from __future__ import annotations

import asyncio

from ddpjob_operator.runtime.workqueue import WorkQueue


def test_dedup_and_dirty_requeue() -> None:
    async def scenario() -> list[str]:
        q: WorkQueue[str] = WorkQueue()
        q.add("a")
        q.add("a")
        q.add("b")
        assert len(q) == 2
        key = await q.get()
        q.add(key)  # changed while in work: one more pass after this one
        assert len(q) == 1
        q.done(key)
        seen = [key, await q.get(), await q.get()]
        assert len(q) == 0
        return seen

    assert asyncio.run(scenario()) == ["a", "b", "a"]


def test_add_after_keeps_the_earliest() -> None:
    async def scenario() -> str:
        q: WorkQueue[str] = WorkQueue()
        q.add_after("a", 0.05)
        q.add_after("a", 10)
        key = await asyncio.wait_for(q.get(), timeout=1)
        q.close()
        return key

    assert asyncio.run(scenario()) == "a"

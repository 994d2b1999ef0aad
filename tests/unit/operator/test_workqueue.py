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


def test_asked_for_passes_go_before_periodic_ones_and_a_periodic_key_asked_for_moves_up() -> None:
    async def scenario() -> list[str]:
        q: WorkQueue[str] = WorkQueue()
        for key in ("p1", "p2", "p3"):
            q.add(key, periodic=True)
        q.add("e1")
        q.add("p2")  # asked for while waiting for its periodic pass: now with the others asked for
        q.add("e1", periodic=True)  # a periodic add never moves a key down
        assert len(q) == 4
        return [await q.get() for _ in range(4)]

    assert asyncio.run(scenario()) == ["e1", "p2", "p1", "p3"]


def test_a_key_added_in_work_goes_back_to_the_lane_it_was_asked_for_in() -> None:
    async def scenario() -> list[str]:
        q: WorkQueue[str] = WorkQueue()
        q.add("a")
        q.add("b", periodic=True)
        key = await q.get()
        q.add(key, periodic=True)
        q.done(key)  # periodic: after b, which waited first
        first = [key, await q.get()]
        q.add("c", periodic=True)
        q.add(first[1], periodic=True)
        q.add(first[1])  # once asked for, the pass after this one is asked for too
        q.done(first[1])
        return [*first, await q.get(), await q.get(), await q.get()]

    assert asyncio.run(scenario()) == ["a", "b", "b", "a", "c"]


def test_getters_waiting_on_an_empty_queue_each_get_one_key() -> None:
    async def scenario() -> set[str]:
        q: WorkQueue[str] = WorkQueue()
        getters = [asyncio.create_task(q.get()) for _ in range(3)]
        await asyncio.sleep(0)
        q.add("x", periodic=True)
        q.add("y")
        q.add("x")  # moved up while a getter may already hold a release
        done, pending = await asyncio.wait(getters, timeout=0.2)
        for task in pending:
            task.cancel()
        assert len(done) == 2 and len(q) == 0
        return {t.result() for t in done}

    assert asyncio.run(scenario()) == {"x", "y"}

"""ElasticDistributedSampler (ddpjob_worker.sampler): the epoch's position is global, so a resume with another
world size deals out exactly the samples not seen yet; without a change the order is DistributedSampler's."""

from __future__ import annotations

from collections import Counter

import pytest
from ddpjob_worker.sampler import (
    ElasticDistributedSampler,
    ResumableDistributedSampler,
    remaining_count,
    remaining_order,
)
from torch.utils.data import DistributedSampler

pytestmark = pytest.mark.unit


def samplers(n: int, world: int, cls: type[DistributedSampler[int]], **kw: object) -> list[DistributedSampler[int]]:
    data = list(range(n))
    return [cls(data, num_replicas=world, rank=r, seed=7, **kw) for r in range(world)]  # type: ignore[arg-type]


@pytest.mark.parametrize("n", [1, 2, 9, 10, 12, 13])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [True, False])
def test_without_a_resume_the_order_is_distributed_samplers(n: int, world: int, shuffle: bool,
                                                            drop_last: bool) -> None:
    ours = samplers(n, world, ElasticDistributedSampler, shuffle=shuffle, drop_last=drop_last)
    theirs = samplers(n, world, DistributedSampler, shuffle=shuffle, drop_last=drop_last)
    for epoch in (0, 3):
        for a, b in zip(ours, theirs, strict=True):
            a.set_epoch(epoch)
            b.set_epoch(epoch)
            assert len(a) == len(b) and list(a) == list(b)


@pytest.mark.parametrize(("order", "start", "replicas", "drop_last", "want"), [
    ([5, 1, 4, 2, 3], 0, 2, False, [5, 1, 4, 2, 3, 5]),  # padded from the epoch's start, as DistributedSampler
    ([5, 1, 4, 2, 3], 2, 2, False, [4, 2, 3, 5]),
    ([5, 1, 4, 2, 3], 2, 2, True, [4, 2]),  # the tail that does not fill a round is dropped
    ([5, 1, 4, 2, 3], 4, 3, False, [3, 5, 1]),  # one left for three ranks: the last batch of an epoch
    ([5, 1, 4, 2, 3], 4, 3, True, []),  # ... dropped: the epoch is over
    ([5, 1, 4, 2, 3], 5, 2, False, []),  # at the end: nothing, no padding of nothing
    ([7], 0, 4, False, [7, 7, 7, 7]),  # fewer samples than ranks: repeated
    ([], 0, 2, False, []),
])
def test_remaining_order(order: list[int], start: int, replicas: int, drop_last: bool, want: list[int]) -> None:
    assert remaining_order(order, start, replicas, drop_last) == want
    assert remaining_count(len(order), start, replicas, drop_last) == len(want)


def run_phase(world: int, n: int, epoch: int, consumed: int, steps: int | None, batch: int,
              drop_last: bool) -> tuple[list[int], int]:
    """Every rank of a world of ``world`` takes ``steps`` batches (None: to the end of the epoch) from global
    position ``consumed``; returns the indices they consumed and the position a checkpoint then records."""
    seen: list[int] = []
    position = consumed
    for s in samplers(n, world, ElasticDistributedSampler, drop_last=drop_last):
        assert isinstance(s, ElasticDistributedSampler)
        s.set_epoch(epoch, consumed=consumed)
        mine = list(s)
        take = len(mine) if steps is None else min(len(mine), steps * batch)
        seen += mine[:take]
        position = s.position(take)
    return seen, position


@pytest.mark.parametrize(("n", "drop_last"), [(60, False), (60, True), (61, True), (64, False)])
@pytest.mark.parametrize("worlds", [[2, 3, 1, 2], [4, 1], [1, 3, 2], [3, 3]])
def test_world_size_changes_mid_epoch_see_every_sample_once(n: int, drop_last: bool, worlds: list[int]) -> None:
    """2 -> 3 -> 1 -> 2 (and others) within one epoch, 2 batches of 3 per rank in each phase but the last, which
    runs to the epoch's end: every index exactly once, except what padding repeats or drop_last leaves out at the
    very end (at most one round of the last world size)."""
    seen: list[int] = []
    consumed = 0
    for i, world in enumerate(worlds):
        last = i == len(worlds) - 1
        got, consumed = run_phase(world, n, epoch=5, consumed=consumed, steps=None if last else 2, batch=3,
                                  drop_last=drop_last)
        seen += got
    counts = Counter(seen)
    left_out = set(range(n)) - set(counts)
    repeated = {i: c for i, c in counts.items() if c > 1}
    round_ = worlds[-1]
    if drop_last:
        assert not repeated and len(left_out) < round_, (left_out, repeated)
    else:
        assert not left_out and sum(c - 1 for c in repeated.values()) < round_, repeated
    assert consumed == (n - len(left_out) if drop_last else n)


def test_the_old_per_rank_skip_repeats_and_loses_samples_when_the_world_changes() -> None:
    """What issue 27 found: skip(n) counts this rank's samples, right only for an unchanged world size."""
    n, batch = 60, 3
    seen: list[int] = []
    for s in samplers(n, 2, ResumableDistributedSampler):
        s.set_epoch(0)
        seen += list(s)[:2 * batch]
    for s in samplers(n, 3, ResumableDistributedSampler):
        assert isinstance(s, ResumableDistributedSampler)
        s.set_epoch(0)
        s.skip(2 * batch)  # the steps done, as charlm skips them
        seen += list(s)
    counts = Counter(seen)
    assert set(range(n)) - set(counts) or any(c > 1 for c in counts.values())


def test_skip_is_the_global_position_of_an_unchanged_world() -> None:
    for a, b in zip(samplers(13, 3, ResumableDistributedSampler), samplers(13, 3, ElasticDistributedSampler),
                    strict=True):
        assert isinstance(a, ResumableDistributedSampler) and isinstance(b, ElasticDistributedSampler)
        a.set_epoch(2)
        a.skip(2)
        b.set_epoch(2, consumed=6)
        plain: DistributedSampler[int] = DistributedSampler(list(range(13)), num_replicas=3,  # type: ignore[arg-type]
                                                            rank=a.rank, seed=7)
        plain.set_epoch(2)
        assert len(a) == len(b) == len(plain) - 2
        assert list(a) == list(b) == list(plain)[2:]  # the old skip's meaning, unchanged


def test_a_resume_applies_to_the_next_iteration_only_and_is_checked() -> None:
    s = samplers(10, 2, ElasticDistributedSampler)[0]
    assert isinstance(s, ElasticDistributedSampler)
    s.set_epoch(1, consumed=4)
    assert len(s) == 3 and s.position(0) == 4
    first = list(s)
    assert s.position(2) == 8 and len(s) == 5 and len(list(s)) == 5 and len(first) == 3
    with pytest.raises(ValueError, match="consumed must be >= 0"):
        s.set_epoch(1, consumed=-1)
    s.set_epoch(1, consumed=99)
    assert list(s) == [] and s.position(0) == 10


@pytest.mark.parametrize("consumed", [0, 5, 11])
def test_rank_indices_are_what_the_next_iteration_yields_without_starting_it(consumed: int) -> None:
    for sampler in samplers(13, 3, ElasticDistributedSampler):
        assert isinstance(sampler, ElasticDistributedSampler)
        sampler.set_epoch(1, consumed=consumed)
        ahead = sampler.rank_indices()
        assert sampler.rank_indices() == ahead == list(sampler)
        assert len(sampler.rank_indices()) == 5  # the resume applied to that iteration only: 13 padded to 15


def test_a_loader_with_worker_processes_yields_the_resumed_order() -> None:
    """The sampler runs in the main process; a DataLoader's workers only fetch what it yields."""
    from torch.utils.data import DataLoader

    data = list(range(40))
    sampler = ElasticDistributedSampler(data, num_replicas=3, rank=1, seed=5, drop_last=True)
    sampler.set_epoch(2, consumed=13)
    want = sampler.rank_indices()
    loader: DataLoader[int] = DataLoader(data, batch_size=2, sampler=sampler, num_workers=2)  # type: ignore[arg-type]
    assert [int(i) for batch in loader for i in batch] == want

"""A constant global batch across world sizes (ddpjob_worker.globalbatch): the plan's arithmetic, and that with
ElasticDistributedSampler each optimizer step consumes the same samples whatever the world size, also across
world-size changes at step boundaries."""

from __future__ import annotations

import pytest
from ddpjob_worker.globalbatch import BatchPlan, plan_batches, suggest
from ddpjob_worker.sampler import ElasticDistributedSampler

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("world", "micro", "global_batch", "want"), [
    (1, 16, 48, BatchPlan(16, 3, 1)),
    (2, 16, 48, BatchPlan(12, 2, 2)),
    (3, 16, 48, BatchPlan(16, 1, 3)),
    (4, 16, 48, BatchPlan(12, 1, 4)),
    (6, 16, 48, BatchPlan(8, 1, 6)),
    (48, 16, 48, BatchPlan(1, 1, 48)),
    (2, 4, 14, BatchPlan(1, 7, 2)),  # a prime share: micro-batches of one
    (1, 64, 48, BatchPlan(48, 1, 1)),  # the share fits in one micro-batch
    (3, 16, 0, BatchPlan(16, 1, 3)),  # no global batch: the per-rank batch, as before
])
def test_plan(world: int, micro: int, global_batch: int, want: BatchPlan) -> None:
    plan = plan_batches(world, micro, global_batch)
    assert plan == want
    assert plan.global_batch == (global_batch or micro * world)
    assert plan.micro_batch <= micro


@pytest.mark.parametrize(("world", "global_batch", "hint"), [(5, 48, "60 suits 1..5"), (4, 6, "12 suits 1..4")])
def test_a_global_batch_that_does_not_split_names_the_fix(world: int, global_batch: int, hint: str) -> None:
    with pytest.raises(ValueError, match=f"{global_batch} does not split among {world} ranks.*{hint}"):
        plan_batches(world, 16, global_batch)


def test_bad_numbers_are_refused() -> None:
    for args in [(0, 16, 48), (2, 0, 48), (2, 16, -1)]:
        with pytest.raises(ValueError, match="must be >= 1"):
            plan_batches(*args)
    assert suggest(48, 3) == 48 and suggest(50, 3) == 54 and suggest(1, 1) == 1


def step_samples(n: int, worlds: list[int], global_batch: int, micro: int, steps_each: int) -> list[set[int]]:
    """The samples of each optimizer step, all ranks together, for a job whose world size goes through
    ``worlds``, changing after ``steps_each`` steps (each new world resumes from the recorded position)."""
    data, steps, position = list(range(n)), [], 0
    for world in worlds:
        plan = plan_batches(world, micro, global_batch)
        samplers = [ElasticDistributedSampler(data, num_replicas=world, rank=r, seed=3, drop_last=True)
                    for r in range(world)]
        for s in samplers:
            s.set_epoch(0, consumed=position)
        per_rank = [s.rank_indices() for s in samplers]
        for k in range(steps_each):
            steps.append({i for idx in per_rank for i in idx[k * plan.per_rank:(k + 1) * plan.per_rank]})
        position = samplers[0].position(steps_each * plan.per_rank)
    return steps


@pytest.mark.parametrize("worlds", [[2, 3, 1, 2], [1, 4, 2], [3, 6, 1]])
def test_each_step_consumes_the_same_samples_whatever_the_world_size(worlds: list[int]) -> None:
    n, global_batch = 1000, 48
    order = ElasticDistributedSampler(list(range(n)), num_replicas=1, rank=0, seed=3).order()
    steps = step_samples(n, worlds, global_batch, micro=16, steps_each=4)
    fixed = step_samples(n, [worlds[0]] * len(worlds), global_batch, micro=16, steps_each=4)
    assert steps == fixed
    assert steps == [set(order[k * global_batch:(k + 1) * global_batch]) for k in range(len(steps))]


def test_without_a_global_batch_a_step_grows_with_the_world() -> None:
    steps = step_samples(1000, [2, 3], 0, micro=8, steps_each=2)
    assert [len(s) for s in steps] == [16, 16, 24, 24]

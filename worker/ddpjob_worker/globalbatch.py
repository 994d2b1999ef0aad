"""A global batch that stays what the user asked for when the world size changes (torch-free arithmetic).

An optimizer step of a data-parallel job averages the gradients of ``micro_batch * accumulation * world`` samples.
When an elastic job changes its world size, keeping the per-rank batch fixed changes that number, and with it the
step's noise, the learning rate's meaning and the steps per epoch (so the LR schedule, counted in steps, no longer
ends where the epochs do). ``plan_batches`` instead keeps ``global_batch`` fixed and lets gradient accumulation
absorb the change: world 1, 2 and 3 with a global batch of 48 and micro-batches of at most 16 run 16 x 3, 12 x 2
and 16 x 1 per rank.

With ``ElasticDistributedSampler`` each optimizer step then consumes the same samples whatever the world size:
the sampler deals the epoch's order round-robin, so ``accumulation`` micro-batches on every rank are exactly the
next ``global_batch`` positions of the order (docs/checkpoints.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["BatchPlan", "plan_batches", "suggest"]


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """Samples per rank per forward/backward (``micro_batch``), micro-batches per optimizer step
    (``accumulation``) and the world size they were planned for."""

    micro_batch: int
    """Samples per rank per forward/backward pass."""
    accumulation: int
    """Micro-batches per optimizer step (gradient accumulation); 1: every micro-batch steps."""
    world: int
    """The world size the plan is for."""

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step, all ranks together."""
        return self.micro_batch * self.accumulation * self.world

    @property
    def per_rank(self) -> int:
        """Samples one rank consumes per optimizer step."""
        return self.micro_batch * self.accumulation


def plan_batches(world: int, micro_batch: int, global_batch: int = 0) -> BatchPlan:
    """The plan for ``world`` ranks: without ``global_batch`` (0) every rank steps on one micro-batch of
    ``micro_batch`` samples (the global batch then grows with the world); with it, the largest micro-batch of at
    most ``micro_batch`` samples that divides the rank's share, and as many of them as the share needs.

    Args:
        world: The world size (ranks of the job now).
        micro_batch: The most samples one rank may take per forward/backward pass (what fits in its memory).
        global_batch: Samples per optimizer step, all ranks together; 0: ``micro_batch`` per rank, whatever the
            world size.

    Returns:
        The plan.

    Raises:
        ValueError: An argument is out of range, or ``global_batch`` does not split evenly among ``world`` ranks
            (the message names a global batch that does).
    """
    if world < 1 or micro_batch < 1 or global_batch < 0:
        raise ValueError(f"world ({world}) and micro_batch ({micro_batch}) must be >= 1, global_batch "
                         f"({global_batch}) >= 0")
    if global_batch == 0:
        return BatchPlan(micro_batch, 1, world)
    if global_batch % world:
        raise ValueError(f"a global batch of {global_batch} does not split among {world} ranks: give a multiple of "
                         f"every world size the job may run with ({suggest(global_batch, world)} suits 1..{world})")
    share = global_batch // world
    micro = max(d for d in range(1, min(micro_batch, share) + 1) if share % d == 0)
    return BatchPlan(micro, share // micro, world)


def suggest(global_batch: int, max_world: int) -> int:
    """The smallest multiple of lcm(1..max_world) that is at least ``global_batch``.

    Args:
        global_batch: The global batch asked for.
        max_world: The largest world size the job may run with.

    Returns:
        A global batch that splits evenly among any world size from 1 to ``max_world``.
    """
    lcm = math.lcm(*range(1, max_world + 1))
    return -(-global_batch // lcm) * lcm

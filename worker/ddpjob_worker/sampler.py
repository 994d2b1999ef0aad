"""Samplers that resume mid-epoch: a resumed run sees exactly the samples it had not seen, whatever the world size.

The position in an epoch is global: how many samples of the epoch's order (the permutation ``DistributedSampler``
draws from ``seed + epoch``) the whole job has consumed. ``DistributedSampler`` deals that order out round-robin,
rank r taking positions r, r + W, r + 2W, ...; when every rank has consumed k samples, the job has consumed exactly
the first k * W positions. So a position is a prefix, and a job that resumes with another world size deals out
the rest of the same order among its new ranks: over the epoch every sample is seen once, whatever the changes.
Padding (without ``drop_last``) and the dropped tail (with it) apply to what is left, as ``DistributedSampler``
applies them to the whole epoch, and without a change the order is exactly ``DistributedSampler``'s.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DistributedSampler

__all__ = ["ElasticDistributedSampler", "ResumableDistributedSampler", "remaining_count", "remaining_order"]


def remaining_order(order: list[int], start: int, replicas: int, drop_last: bool) -> list[int]:
    """What is left of an epoch's ``order`` from global position ``start``, cut or padded to a multiple of
    ``replicas``: padding repeats the epoch's first indices, as ``DistributedSampler`` pads the whole epoch.

    Args:
        order: The epoch's whole order (dataset indices).
        start: The global position the rest begins at: samples of ``order`` already consumed.
        replicas: The world size the rest is dealt out to.
        drop_last: Cut the tail that does not fill a round instead of padding it.

    Returns:
        The rest of the order, its length a multiple of ``replicas``; rank r takes every ``replicas``-th index
        from position r.
    """
    rest = order[start:]
    if drop_last:
        return rest[:len(rest) - len(rest) % replicas]
    padding = -len(rest) % replicas
    if padding and order:
        rest += (order * math.ceil(padding / len(order)))[:padding]
    return rest


def remaining_count(total: int, start: int, replicas: int, drop_last: bool) -> int:
    """``len(remaining_order(...))`` without drawing the order.

    Args:
        total: The epoch's length (the dataset's).
        start: The global position the rest begins at.
        replicas: The world size the rest is dealt out to.
        drop_last: Cut the tail that does not fill a round instead of padding it.

    Returns:
        How many indices the rest holds, all ranks together.
    """
    left = max(0, total - start)
    return left - left % replicas if drop_last else math.ceil(left / replicas) * replicas


class ElasticDistributedSampler(DistributedSampler[Any]):
    """A drop-in for ``DistributedSampler`` (same arguments, same order without a resume) whose epoch can start at
    a global position: ``set_epoch(epoch, consumed=...)``, where ``consumed`` is what ``position`` returned when the
    checkpoint was taken, with any world size then and now.

        sampler.set_epoch(epoch, consumed=state.samples_in_epoch)
        for i, batch in enumerate(loader, start=1):
            ...; state.samples_in_epoch = sampler.position(i * batch_size)
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Takes ``DistributedSampler``'s arguments; the epoch starts at its beginning until told otherwise.

        Args:
            *args: ``DistributedSampler``'s: ``dataset``, ``num_replicas``, ``rank``, ``shuffle``, ``seed``,
                ``drop_last``.
            **kwargs: The same, by name.
        """
        super().__init__(*args, **kwargs)
        self._start = 0  # where the next iteration starts (once: then the epoch's start again)
        self._began = 0  # where the current iteration started

    def set_epoch(self, epoch: int, consumed: int = 0) -> None:
        """Iterate epoch ``epoch`` next, from global position ``consumed`` (0: its start).

        Args:
            epoch: The epoch: with ``seed``, it draws the epoch's order.
            consumed: What ``position`` returned when the checkpoint was taken (``TrainState.samples_in_epoch``).

        Raises:
            ValueError: ``consumed`` is negative.
        """
        super().set_epoch(epoch)
        self.resume_at(consumed)

    def resume_at(self, consumed: int) -> None:
        """The next iteration starts at global position ``consumed`` of the epoch (once).

        Args:
            consumed: Samples of the epoch's order the whole job has consumed; past the end, the epoch is done.

        Raises:
            ValueError: ``consumed`` is negative.
        """
        if consumed < 0:
            raise ValueError(f"consumed must be >= 0 samples, got {consumed}")
        self._start = self._began = min(consumed, len(self.dataset))  # type: ignore[arg-type]

    def position(self, local_samples: int) -> int:
        """The epoch's global position once this rank has consumed ``local_samples`` samples of the current
        iteration (every rank the same number): what a checkpoint records to resume from.

        Args:
            local_samples: Samples this rank has consumed since the iteration began (batches x batch size).

        Returns:
            The global position, at most the dataset's length.
        """
        return min(len(self.dataset), self._began + local_samples * self.num_replicas)  # type: ignore[arg-type]

    def order(self) -> list[int]:
        """The epoch's whole order, before padding or cutting.

        Returns:
            ``DistributedSampler``'s permutation of the dataset's indices for this epoch (``range`` unshuffled).
        """
        total = len(self.dataset)  # type: ignore[arg-type]
        if not self.shuffle:
            return list(range(total))
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        return torch.randperm(total, generator=generator).tolist()

    def rank_indices(self) -> list[int]:
        """What the next iteration yields on this rank, without starting it (to record which samples a step
        consumed: micro-batch i of b samples is ``rank_indices()[i * b:(i + 1) * b]``).

        Returns:
            This rank's indices, in the order the iteration yields them.
        """
        rest = remaining_order(self.order(), self._start, self.num_replicas, self.drop_last)
        return rest[self.rank::self.num_replicas]

    def __iter__(self) -> Iterator[Any]:
        indices = self.rank_indices()
        self._began, self._start = self._start, 0
        return iter(indices)

    def __len__(self) -> int:
        total = len(self.dataset)  # type: ignore[arg-type]
        return remaining_count(total, self._start, self.num_replicas, self.drop_last) // self.num_replicas


class ResumableDistributedSampler(ElasticDistributedSampler):
    """``DistributedSampler`` plus ``skip(n)``: the next iteration drops this rank's first ``n`` indices of the
    epoch's order. Right only when the world size is the one the skipped samples were consumed with; use
    ``ElasticDistributedSampler.set_epoch(epoch, consumed=...)`` where it may change."""

    def skip(self, samples: int) -> None:
        """Drop the first ``samples`` indices of the next epoch iteration (once).

        Args:
            samples: This rank's samples already consumed in the epoch (steps x batch size); negative counts as 0.
        """
        self.resume_at(max(0, samples) * self.num_replicas)

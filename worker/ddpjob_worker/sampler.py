"""A DistributedSampler that can start mid-epoch, so a resumed run sees exactly the batches it had not seen."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import DistributedSampler


class ResumableDistributedSampler(DistributedSampler[Any]):
    """``DistributedSampler`` plus ``skip(n)``: the next iteration drops this rank's first ``n`` indices of the
    epoch's (seeded, set_epoch-dependent) order. Skipping in the sampler costs nothing, where skipping batches
    of a DataLoader would load and discard them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._skip = 0

    def skip(self, samples: int) -> None:
        """Drop the first ``samples`` indices of the next epoch iteration (once)."""
        self._skip = max(0, samples)

    def __iter__(self) -> Iterator[Any]:
        indices = list(super().__iter__())
        skip, self._skip = self._skip, 0
        return iter(indices[skip:])

    def __len__(self) -> int:
        return max(0, self.num_samples - self._skip)

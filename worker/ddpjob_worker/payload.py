"""What a checkpoint holds (docs/checkpoints.md, "What a checkpoint holds"): where training is (``TrainState``), the
state dicts of the model, optimizer, LR scheduler and grad scaler (``TrainingObjects``), and the layout's version;
Checkpointer adds every rank's RNG states (rngstate) and saves the dict ``build_payload`` builds."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

#: The layout of a checkpoint's payload (the dict ``build_payload`` builds), recorded in it as ``format``.
FORMAT_VERSION = 1


@dataclasses.dataclass(kw_only=True, slots=True)
class TrainState:
    """Where training is; saved with every checkpoint and returned by ``resume``."""

    epoch: int = 0
    """The epoch in progress (or about to start)."""
    step_in_epoch: int = 0
    """Optimizer steps already done in ``epoch``."""
    samples_in_epoch: int = 0
    """Samples of ``epoch``'s order the whole job has consumed (``ElasticDistributedSampler.position``): where the
    epoch resumes, with any world size. 0 at an epoch's start, and in checkpoints older than this field."""
    global_step: int = 0
    """Optimizer steps done since the start of training; names the ``step-N`` folder."""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Anything else the script wants back (tensors, numbers, strings, lists, dicts)."""

    def next_epoch(self) -> None:
        """Mark the epoch finished, so a checkpoint taken now resumes at the next epoch, not the same one."""
        self.epoch += 1
        self.step_in_epoch = 0
        self.samples_in_epoch = 0


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside DDP, so checkpoints load into a plain model too."""
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, torch.nn.Module) else model


@dataclasses.dataclass(frozen=True, slots=True)
class TrainingObjects:
    """The objects whose state dicts a checkpoint holds (Checkpointer's arguments of the same names)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None = None
    lr_scheduler: Any | None = None
    grad_scaler: Any | None = None

    def state_dicts(self) -> dict[str, Any]:
        """Their state dicts by name (None for an object not given); the model's without the DDP wrapper."""
        return {
            "model": unwrap(self.model).state_dict(),
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None,
            "grad_scaler": self.grad_scaler.state_dict() if self.grad_scaler is not None else None,
        }

    def load(self, data: Mapping[str, Any]) -> None:
        """Inverse of state_dicts: each object given here gets the state the checkpoint holds for it, if any."""
        unwrap(self.model).load_state_dict(data["model"])
        if self.optimizer is not None and data["optimizer"] is not None:
            self.optimizer.load_state_dict(data["optimizer"])
        if self.lr_scheduler is not None and data["lr_scheduler"] is not None:
            self.lr_scheduler.load_state_dict(data["lr_scheduler"])
        if self.grad_scaler is not None and data["grad_scaler"] is not None:
            self.grad_scaler.load_state_dict(data["grad_scaler"])


def build_payload(state: TrainState, world_size: int, rngs: list[Any], objects: TrainingObjects) -> dict[str, Any]:
    """The dict a checkpoint saves: ``state``, the world size, every rank's RNG states (by rank) and the state
    dicts of ``objects``."""
    return {"format": FORMAT_VERSION, "train": dataclasses.asdict(state), "world_size": world_size, "rng": rngs,
            **objects.state_dicts()}

"""Checkpoint copies for ranks that do not all share one volume (a per-pod emptyDir): which rank writes each
volume's copy, which step a resume uses, and how ranks whose volume lacks that step get it from a peer."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from ddpjob_worker import compat, contract


@dataclasses.dataclass(frozen=True, slots=True)
class VolumeLayout:
    """Which ranks see the same checkpoint volume; the lowest rank of each volume writes its copy."""

    volumes: tuple[str, ...]
    """The volume id each rank read from its checkpoint directory, by rank."""
    pods: tuple[str, ...]
    """Each rank's pod (worker index and host name), by rank; only for telling the storage mode apart."""

    def writer(self, rank: int) -> int:
        """The rank that writes the copy on ``rank``'s volume."""
        return self.volumes.index(self.volumes[rank])

    @property
    def writers(self) -> tuple[int, ...]:
        """One rank per volume, lowest first (rank 0 is always one)."""
        return tuple(r for r in range(len(self.volumes)) if self.writer(r) == r)

    def describe(self) -> tuple[int, str]:
        """A log level and line saying how checkpoints are stored: one shared copy, one per pod, or (a warning)
        volumes shared by some pods only, such as a ReadWriteOnce claim mounted on several nodes."""
        copies = len(self.writers)
        if copies == 1:
            return logging.INFO, f"checkpoint volume shared by all {len(self.volumes)} ranks; rank 0 writes"
        pods_of = {v: {p for p, pv in zip(self.pods, self.volumes, strict=True) if pv == v} for v in set(self.volumes)}
        volumes_of = {p: {v for v, pp in zip(self.volumes, self.pods, strict=True) if pp == p} for p in set(self.pods)}
        if all(len(p) == 1 for p in pods_of.values()) and all(len(v) == 1 for v in volumes_of.values()):
            return logging.INFO, (f"each of the {copies} pods has its own checkpoint volume: ranks {self.writers} "
                                  "each write a full copy, and a replaced pod receives the state from a peer")
        return logging.WARNING, (
            f"the checkpoint directory is {copies} different volumes for {len(volumes_of)} pods (a ReadWriteOnce "
            f"claim mounted on several nodes, or a directory that differs per pod?); ranks {self.writers} each write "
            "a full copy to theirs. Use a ReadWriteMany claim for one shared copy, or no claim for one per pod")


@dataclasses.dataclass(frozen=True, slots=True)
class ResumePlan:
    """What every rank agreed to resume from."""

    step: int | None
    """The newest step any volume holds a valid copy of; None: start from scratch."""
    source: int | None
    """The lowest rank whose volume holds ``step``: the one that sends it to ranks whose volume lacks it."""
    holders: frozenset[int]
    """Ranks whose volume holds ``step`` (they load it locally)."""
    world_size: int

    @property
    def receivers(self) -> frozenset[int]:
        """Ranks whose volume lacks ``step`` (they receive it from ``source``)."""
        if self.step is None:
            return frozenset()
        return frozenset(range(self.world_size)) - self.holders


def plan_resume(newest: Sequence[int | None], layout: VolumeLayout) -> ResumePlan:
    """The plan for ``newest[r]``, the newest valid step rank r's volume holds as its writer found it (other
    ranks' entries are ignored): the newest step anywhere wins, even if only one volume still has it."""
    held = {w: newest[w] for w in layout.writers}
    steps = [s for s in held.values() if s is not None]
    if not steps:
        return ResumePlan(step=None, source=None, holders=frozenset(), world_size=len(layout.volumes))
    step = max(steps)
    holders = frozenset(r for r in range(len(layout.volumes)) if held[layout.writer(r)] == step)
    return ResumePlan(step=step, source=min(holders), holders=holders, world_size=len(layout.volumes))


def this_pod() -> str:
    """This process's pod: the worker index (distinct per pod, also locally) and the host name."""
    return f"{os.environ.get(contract.DDPJOB_WORKER_INDEX, '?')}@{socket.gethostname()}"


def needs_object_group(backend: str) -> bool:
    """Whether the default group cannot carry the checkpoint library's object collectives itself: any backend but
    plain gloo. NCCL's object collectives put their pickles on the current CUDA device, which is cuda:0 on every
    rank unless the script called torch.cuda.set_device (a hang, or every rank's bytes on one GPU)."""
    return str(backend).lower() != "gloo"


def object_group() -> Any:
    """Collective (every rank together, once per Checkpointer): the group for the object collectives of
    checkpoint, fencing, replicas and staging. None (the default group) when that is gloo; else a gloo group of
    every rank, so a GPU job never depends on the script's CUDA device for them."""
    if not (dist.is_available() and dist.is_initialized()) or not needs_object_group(dist.get_backend()):
        return None
    group = dist.new_group(backend="gloo")
    compat.keep_group(group)  # freed with its Checkpointer, it could hang the trainer on torch < 2.15 (compat)
    return group


def discover(volume_id: str, group: Any = None) -> VolumeLayout:
    """Collective: every rank's volume id and pod (``group``: object_group's)."""
    mine = (volume_id, this_pod())
    if not (dist.is_available() and dist.is_initialized()):
        return VolumeLayout(volumes=(mine[0],), pods=(mine[1],))
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine, group=group)
    return VolumeLayout(volumes=tuple(str(v) for v, _ in gathered), pods=tuple(str(p) for _, p in gathered))


def agree(newest: int | None, layout: VolumeLayout, group: Any = None) -> ResumePlan:
    """Collective: the resume plan from every rank's newest valid step (None on non-writers)."""
    if not (dist.is_available() and dist.is_initialized()):
        return plan_resume([newest], layout)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, newest, group=group)
    return plan_resume(gathered, layout)


def to_host(obj: Any, *, copy: bool) -> Any:
    """The same structure with every tensor in host memory: ``copy`` clones even CPU tensors (what an async
    writer needs while training keeps changing the live ones); without it CPU tensors are shared (what crosses the
    wire at a resume)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=copy)
    if isinstance(obj, dict):
        return {k: to_host(v, copy=copy) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_host(v, copy=copy) for v in obj]
    if isinstance(obj, tuple):
        return tuple(to_host(v, copy=copy) for v in obj)
    return obj


def transfer(plan: ResumePlan, data: dict[str, Any] | None) -> dict[str, Any] | None:
    """Collective (every rank calls it when ``plan.receivers`` is not empty): ``plan.source`` sends its loaded
    ``data`` to the receivers, which get it back; other ranks get None. The transfer uses a gloo group of just
    these ranks, so with NCCL the state neither lands in GPU memory nor reaches ranks that do not need it."""
    assert plan.source is not None
    members = sorted({plan.source, *plan.receivers})
    group = dist.new_group(ranks=members, backend="gloo")  # collective over all ranks, members or not
    rank = dist.get_rank()
    if rank not in members:
        return None
    assert isinstance(group, dist.ProcessGroup)
    payload: list[Any] = [to_host(data, copy=False) if rank == plan.source else None]
    dist.broadcast_object_list(payload, src=plan.source, group=group)
    dist.destroy_process_group(group)
    compat.keep_group(group)  # freed as this function returns, it hung resumes on torch 2.6 (compat)
    if rank == plan.source:
        return None
    received: dict[str, Any] = payload[0]
    return received

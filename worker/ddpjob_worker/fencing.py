"""Fencing of stale checkpoint writers: every start of the process group is a new *incarnation* that records on each
checkpoint volume which step it resumed from, and a checkpoint that an earlier incarnation commits past that step
(a partitioned pod finishing its save late) is never resumed from. See docs/checkpoints.md, "Fencing"."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import torch.distributed as dist

# Fence is defined with the Storage interface that stores it; re-exported here, where it has always been imported.
from ddpjob_worker.storage_api import Fence as Fence
from ddpjob_worker.storage_api import Storage

#: The completion marker's ``meta`` key naming the incarnation that committed a checkpoint. A marker without it
#: (written before fencing existed) counts as incarnation 0, which every recorded incarnation follows.
INCARNATION = "incarnation"
#: The folder of fence records on a checkpoint volume, one file per record.
FENCE_DIR = "fence"
_RECORD = re.compile(r"incarnation-(\d+)-resumed-from-(\d+|none)\.json")


def record_name(fence: Fence) -> str:
    """The file name of a record; it holds the whole record, so readers never depend on the file's content."""
    step = "none" if fence.resumed_from is None else str(fence.resumed_from)
    return f"incarnation-{fence.incarnation}-resumed-from-{step}.json"


def parse_record_name(name: str) -> Fence | None:
    """Inverse of record_name; None for any other file (a temporary one, say)."""
    match = _RECORD.fullmatch(name)
    if match is None:
        return None
    step = match.group(2)
    return Fence(int(match.group(1)), None if step == "none" else int(step))


def fenced_by(incarnation: int, step: int, fences: Iterable[Fence]) -> Fence | None:
    """The earliest later incarnation that did not adopt checkpoint ``step`` of ``incarnation`` (it resumed from an
    earlier step, or from scratch), so the checkpoint was committed after the job had moved on without it; None
    when every later incarnation resumed from this step or a newer one: the checkpoint is valid."""
    later = [f for f in fences
             if f.incarnation > incarnation and (f.resumed_from is None or f.resumed_from < step)]
    return min(later, key=lambda f: f.incarnation, default=None)


def incarnation_of(meta: Mapping[str, Any]) -> int:
    """The incarnation that committed a checkpoint, from its marker's ``meta``."""
    return int(meta.get(INCARNATION) or 0)


def stale_reason(storage: Storage, step: int, fences: Collection[Fence]) -> str | None:
    """Why checkpoint ``step`` on ``storage`` is stale, or None if it is not (an unreadable marker is left to
    checksum verification, which rejects it)."""
    if not fences:
        return None
    try:
        committed_by = incarnation_of(storage.read_manifest(step).meta)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    fence = fenced_by(committed_by, step, fences)
    if fence is None:
        return None
    since = "started from scratch" if fence.resumed_from is None else f"resumed from step-{fence.resumed_from}"
    return f"committed by incarnation {committed_by} after incarnation {fence.incarnation} {since}"


class Fenced(RuntimeError):
    """A later incarnation has recorded itself: this process belongs to an earlier start of the job."""


def ensure_current(storage: Storage, incarnation: int) -> None:
    """Raise Fenced if a later incarnation than ``incarnation`` has recorded itself on ``storage``: checked just
    before each commit, so a cut-off writer usually wastes no disk (readers do not depend on it)."""
    newer = [f for f in storage.fences() if f.incarnation > incarnation]
    if newer:
        raise Fenced(f"fenced by incarnation {max(f.incarnation for f in newer)}: this process belongs to "
                     f"incarnation {incarnation}, an earlier start of the job, and commits no more checkpoints")


@dataclasses.dataclass(frozen=True, slots=True)
class FenceView:
    """What the writers know when an incarnation begins."""

    fences: frozenset[Fence] = frozenset()
    """Every record any writer's volume holds: a record on one volume fences checkpoints on all of them."""
    newest: int = 0
    """The highest incarnation any record or checkpoint names, so numbers only grow even if records were lost."""


def read_view(storage: Storage) -> FenceView:
    """What one volume holds: its records, and the highest incarnation they or its checkpoints name."""
    fences = frozenset(storage.fences())
    newest = max((f.incarnation for f in fences), default=0)
    for step in storage.committed_steps():
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            newest = max(newest, incarnation_of(storage.read_manifest(step).meta))
    return FenceView(fences, newest)


def merge(views: Sequence[FenceView | None]) -> FenceView:
    """The union of the writers' views (None from ranks that write no volume)."""
    present = [v for v in views if v is not None]
    return FenceView(frozenset().union(*(v.fences for v in present)), max((v.newest for v in present), default=0))


def gather(storage: Storage | None, group: Any = None) -> FenceView:
    """Collective: the merged view of every writer's volume; pass ``storage`` on writers only (``group``:
    replicas.object_group's)."""
    mine = read_view(storage) if storage is not None else None
    if not (dist.is_available() and dist.is_initialized()):
        return merge([mine])
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine, group=group)
    return merge(gathered)


def begin(storage: Storage | None, view: FenceView, resumed_from: int | None) -> int:
    """Start the next incarnation and return its number (the same on every rank, computed from the same view).
    A writer stores the records its volume lacks, its own last, so a fresh volume (a replaced pod's) carries the
    job's history too; each is durable before this returns, i.e. before this incarnation trains a step."""
    incarnation = view.newest + 1
    if storage is not None:
        have = set(storage.fences())
        for fence in sorted(view.fences | {Fence(incarnation, resumed_from)}, key=lambda f: f.incarnation):
            if fence not in have:
                storage.add_fence(fence)
    return incarnation

"""The interface between checkpoints and where they live: the ``Storage`` Protocol and the records its methods take
and return, imported by every module that uses a storage (checkpoint, fencing, staging) and by the one that
implements it (storage: ``LocalStorage``), as torch elastic keeps each concept's interface in an ``api.py`` of its
own. Standard library only: no torch, and no import of the modules above it, so none of them imports another one
just to name the type (fencing and storage imported each other for it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol

__all__ = ["CorruptCheckpoint", "Fence", "Manifest", "Storage"]


@dataclasses.dataclass(frozen=True, slots=True)
class Manifest:
    """What the completion marker records about one checkpoint."""

    step: int
    """The checkpoint's step: the ``global_step`` it was saved at, and its folder's name (``step-N``)."""
    sha256: str
    """The payload's SHA-256, hex."""
    size: int
    """The payload's size in bytes."""
    created: str
    """When the checkpoint was committed (UTC, RFC 3339)."""
    meta: dict[str, Any]
    """The writer's notes: world size, incarnation (see fencing)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Fence:
    """One incarnation's record: from now on, checkpoints of earlier incarnations past ``resumed_from`` are stale."""

    incarnation: int
    """Numbers the starts of the process group on the job's volumes, from 1; a later start gets a higher one."""
    resumed_from: int | None
    """The step this incarnation resumed from; None: it started from scratch."""


class CorruptCheckpoint(Exception):
    """A committed checkpoint whose payload does not match its completion marker."""


class Storage(Protocol):
    """The storage a Checkpointer needs; LocalStorage implements it on a POSIX directory (a PVC in a pod)."""

    def committed_steps(self) -> list[int]:
        """Steps that have a completion marker, newest first (not yet verified).

        Returns:
            The steps, newest first; empty when the storage holds none (or does not exist yet).
        """
        ...

    def write(self, step: int, state: Mapping[str, Any], meta: Mapping[str, Any], *,
              before_commit: Callable[[], None] | None = None) -> Manifest:
        """Serialize ``state`` as checkpoint ``step`` atomically; a crash inside leaves no ``step`` visible, and so
        does an exception from ``before_commit`` (called when everything but the commit is done).

        Args:
            step: The checkpoint's step; an existing checkpoint of that step is replaced.
            state: What to save (tensors, numbers, strings, lists, dicts).
            meta: Recorded in the completion marker (``Manifest.meta``).
            before_commit: Called just before the commit; raising stops it (fencing.ensure_current).

        Returns:
            The committed checkpoint's manifest.
        """
        ...

    def read_manifest(self, step: int) -> Manifest:
        """The parsed completion marker of ``step``.

        Args:
            step: A committed step.

        Returns:
            Its manifest.

        Raises:
            OSError, ValueError, KeyError, TypeError: The marker is missing or unreadable.
        """
        ...

    def read(self, step: int, map_location: Any, *, verify: bool) -> dict[str, Any]:
        """Load checkpoint ``step``.

        Args:
            step: A committed step.
            map_location: Where tensors go, as ``torch.load`` takes it (this rank's device).
            verify: Check the payload against the marker's checksum before returning it.

        Returns:
            The saved state.

        Raises:
            CorruptCheckpoint: The payload cannot be loaded or, with ``verify``, its checksum does not match.
        """
        ...

    def quarantine(self, step: int, reason: str, *, label: str = "corrupt") -> None:
        """Move a bad checkpoint aside as ``<label>-step-N-<time>`` (kept for inspection, never loaded again).

        Args:
            step: The checkpoint to set aside; nothing happens if it is gone already.
            reason: Why, stored beside it.
            label: The name's prefix (``corrupt``, ``stale``).
        """
        ...

    def purge(self, keep: int, protect: int | None = None, valid: Callable[[int], bool] | None = None) -> list[int]:
        """Delete all but the newest ``keep`` checkpoints (never ``protect``) and leftovers of crashed saves; steps
        that ``valid`` rejects neither count towards ``keep`` nor are deleted.

        Args:
            keep: How many valid checkpoints stay.
            protect: A step that stays whatever its number (the one just written).
            valid: Whether a step counts (not stale); None: every step does.

        Returns:
            The deleted steps.
        """
        ...

    def fences(self) -> list[Fence]:
        """The fence records this storage holds (see fencing).

        Returns:
            The records, lowest incarnation first.
        """
        ...

    def add_fence(self, fence: Fence) -> None:
        """Store a fence record durably; storing one that exists changes nothing.

        Args:
            fence: The record.
        """
        ...

    def volume_id(self) -> str:
        """Names the volume, created on first use.

        Returns:
            The same string for every process that sees this storage (a shared volume), another one for a storage
            of its own (a pod's emptyDir).
        """
        ...

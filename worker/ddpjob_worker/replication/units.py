"""What a script's checkpoint folder holds, judged without importing torch: which files belong together as one
checkpoint (a *unit*), which checkpoints are complete, and which file is a partial write.

The frameworks users bring write checkpoints in a few shapes, and each says "complete" its own way:

- a folder whose name ends in a number (``checkpoint-100``, ``step-100``, ``step_100``) is one checkpoint: the
  Hugging Face Trainer's ``checkpoint-N/`` is complete once ``trainer_state.json`` is there (rank 0 writes it last);
  a ``torch.distributed.checkpoint`` folder once ``.metadata`` is there (the coordinator writes it after every rank's
  shard); a folder of neither kind once every file in it is whole;
- any other file is a checkpoint of its own: ``snapshot.pt`` (the DDP tutorial's rank-0 ``torch.save``, rewritten in
  place), Lightning's ``epoch=0-step=50.ckpt`` and ``last.ckpt``, a ``model.safetensors``.

A file is *whole* when its format says so: a zip (``torch.save``'s format since torch 1.6, ``.ckpt``, ``.pt``) has
its end-of-central-directory record, a safetensors file its header and every tensor's bytes, a JSON file parses.
A writer killed half-way leaves a file that fails these checks, whatever its name; other formats are judged by the
quiet time and the writer's close (ddpjob_worker.replication.scan). Numbered checkpoints of one *family* (same
folder, same name once the numbers are taken out) are ordered by the numbers in their names.
"""

from __future__ import annotations

import json
import re
import struct
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

#: Rank 0 of the Hugging Face Trainer writes it last into ``checkpoint-N/`` (Trainer._save_checkpoint).
HF_MARKER = "trainer_state.json"
#: torch.distributed.checkpoint's coordinator writes it after every rank's shard (FileSystemWriter.finish).
DCP_MARKER = ".metadata"
#: ddpjob_worker.checkpoint's own completion marker: those folders have their own, faster peer path.
CHECKPOINTER_MARKER = "COMPLETE.json"
#: A folder that holds this is a Checkpointer volume (ddpjob_worker.storage): its own names are not replicated.
CHECKPOINTER_VOLUME_ID = ".volume-id"
CHECKPOINTER_NAMES = re.compile(r"^(step-\d+|fence|corrupt-step-.*|stale-step-.*|\.tmp-.*)$")
#: How the object-store tier names a Checkpointer folder among the script's own checkpoints.
CHECKPOINTER_UNIT = "checkpointer:"
#: A folder name ending in a number (the number may follow a separator or an ``=``).
NUMBERED = re.compile(r"\d+$")
_NUMBERS = re.compile(r"\d+")
ZIP_MAGIC = b"PK\x03\x04"


def excluded(parts: tuple[str, ...]) -> bool:
    """Paths never replicated: hidden files and folders (the runtime's own state, error files, temporary names)
    except DCP's ``.metadata``, and ``lost+found``."""
    *dirs, name = parts
    if any(d.startswith(".") or d == "lost+found" for d in dirs):
        return True
    return name.startswith(".") and name != DCP_MARKER


def unit_of(path: str) -> str:
    """The checkpoint a file belongs to: its top-most folder whose name ends in a number, else the file itself."""
    parts = PurePosixPath(path).parts
    for i, part in enumerate(parts[:-1]):
        if NUMBERED.search(part):
            return "/".join(parts[: i + 1])
    return path


def family_of(unit: str) -> tuple[str, str]:
    """(folder, name with its numbers replaced by ``#``): checkpoints of one family replace each other."""
    p = PurePosixPath(unit)
    return str(p.parent), _NUMBERS.sub("#", p.name)


def order_of(unit: str) -> tuple[int, ...]:
    """The numbers in a checkpoint's name, in order (``epoch=1-step=200.ckpt`` -> (1, 200)); () for none."""
    return tuple(int(n) for n in _NUMBERS.findall(PurePosixPath(unit).name))


def numbered(unit: str) -> bool:
    return bool(order_of(unit))


@dataclass(frozen=True, slots=True)
class Judgement:
    """Whether a checkpoint is complete, and if not, why (the sync's log and its error name it)."""

    complete: bool
    kind: str
    """hf | dcp | checkpointer | folder | file"""
    why: str = ""


def judge(unit: str, files: Iterable[str], partial: Iterable[str] = (), world: int = 0) -> Judgement:
    """Judge one checkpoint from the relative paths the job holds of it (``files``: whole ones), those only
    present as partial writes, and the number of trainers of the group that wrote it (0: unknown)."""
    names = {PurePosixPath(f).relative_to(unit).as_posix() for f in files if f != unit}
    broken = sorted(partial)
    if unit in set(files) and not names:  # a file of its own
        return Judgement(not broken, "file", f"partial write of {broken[0]}" if broken else "")
    if CHECKPOINTER_MARKER in names:
        return Judgement(True, "checkpointer")
    if HF_MARKER in names or any(n.startswith(("rng_state", "optimizer.pt", "scheduler.pt")) for n in names):
        kind, marker = "hf", HF_MARKER
    elif DCP_MARKER in names or any(n.endswith(".distcp") for n in names):
        kind, marker = "dcp", DCP_MARKER
    else:
        kind, marker = "folder", ""
    if marker and marker not in names:
        return Judgement(False, kind, f"no {marker} (its writer did not finish)")
    if kind == "hf" and world > 1 and any(n.startswith("rng_state_") for n in names):
        # Every rank writes rng_state_<rank>.pth, rank 0 trainer_state.json, with no barrier in between.
        lacking = [r for r in range(world) if f"rng_state_{r}.pth" not in names]
        if lacking:
            return Judgement(False, kind, f"no rng_state_{lacking[0]}.pth (rank {lacking[0]} of {world} did not "
                                          "finish its part)")
    if broken:
        return Judgement(False, kind, f"partial write of {broken[0]}")
    return Judgement(bool(names), kind, "" if names else "empty")


def newest_complete(units: Mapping[str, Judgement]) -> dict[tuple[str, str], str]:
    """Per family of numbered checkpoints, the complete one with the highest numbers."""
    best: dict[tuple[str, str], str] = {}
    for unit, j in units.items():
        if not j.complete or not numbered(unit) or j.kind == "checkpointer":
            continue
        fam = family_of(unit)
        if fam not in best or order_of(unit) > order_of(best[fam]):
            best[fam] = unit
    return best


#: Bytes read from a file's start: a safetensors header of this size covers models of thousands of tensors.
HEAD_BYTES = 1 << 20


def self_checking(path: str, root: Path) -> bool:
    """Whether a file's format can tell a partial write from a whole one (zip, safetensors, JSON)."""
    name = PurePosixPath(path).name
    if name.endswith((".safetensors", ".json")):
        return True
    try:
        with open(root / path, "rb") as f:
            return f.read(4) == ZIP_MAGIC
    except OSError:
        return False


def whole(path: str, size: int) -> bool:
    """Whether a file's format says it is complete (see the module docstring); True for formats without a check.
    Never raises: a file that vanished or cannot be read is not whole."""
    name = PurePosixPath(path).name
    try:
        with open(path, "rb") as f:
            head = f.read(min(size, HEAD_BYTES))
            if head.startswith(ZIP_MAGIC):
                return _zip_whole(f, size)
            if name.endswith(".safetensors"):
                return _safetensors_whole(head, size)
            if name.endswith(".json"):
                return _json_whole(f, size)
    except OSError:
        return False
    return True


def _zip_whole(f: BinaryIO, size: int) -> bool:
    # The end-of-central-directory record is written last; torch.save and fsspec both end with it. ZipFile reads
    # only that record and the central directory, not the members.
    if size < 22:
        return False
    try:
        with zipfile.ZipFile(f) as z:
            return bool(z.infolist())
    except (zipfile.BadZipFile, EOFError, ValueError):
        return False


def _safetensors_whole(head: bytes, size: int) -> bool:
    """8 bytes of header length, the JSON header, then the tensors: whole when the file reaches the end of the
    last tensor the header names."""
    if len(head) < 8:
        return False
    n = int(struct.unpack("<Q", head[:8])[0])
    if n == 0 or 8 + n > size:
        return False
    if len(head) < 8 + n:
        return True  # a header larger than what was read: the size check above is what there is
    try:
        header = json.loads(head[8: 8 + n])
    except ValueError:
        return False
    ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)]
    return size >= 8 + n + max(ends, default=0)


def _json_whole(f: BinaryIO, size: int) -> bool:
    if size > 64 << 20:  # a JSON file that large is data, not a marker: the quiet time judges it
        return True
    f.seek(0)
    try:
        json.loads(f.read())
    except ValueError:
        return False
    return True

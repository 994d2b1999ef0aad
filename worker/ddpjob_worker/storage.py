"""Where checkpoints live: ``step-N`` folders that appear atomically and carry a checksummed completion marker.

A folder is written under a temporary name (payload -> fsync -> marker with SHA-256 -> fsync -> rename ->
fsync of the parent), so a crash at any instant leaves either the complete folder or none; a folder without
its marker, or whose payload no longer matches the marker's digest, is never loaded.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

#: The completion marker; its presence is what makes a step folder a checkpoint.
MARKER = "COMPLETE.json"
#: The serialized training state inside a step folder.
PAYLOAD = "state.pt"
_STEP_PREFIX = "step-"
_CHUNK = 8 << 20


@dataclass(frozen=True, slots=True)
class Manifest:
    """What the completion marker records about one checkpoint."""

    step: int
    sha256: str
    size: int
    created: str
    meta: dict[str, Any]


class Storage(Protocol):
    """The storage a Checkpointer needs; LocalStorage implements it on a POSIX directory (a PVC in a pod)."""

    def committed_steps(self) -> list[int]:
        """Steps that have a completion marker, newest first (not yet verified)."""
        ...

    def write(self, step: int, write_payload: Callable[[BinaryIO], None], meta: Mapping[str, Any]) -> Manifest:
        """Write one checkpoint atomically; a crash inside leaves no ``step`` visible."""
        ...

    def verify(self, step: int) -> str | None:
        """None when the checkpoint is intact, else why it is not."""
        ...

    def open_payload(self, step: int) -> BinaryIO:
        """The payload for reading."""
        ...

    def quarantine(self, step: int, reason: str) -> None:
        """Move a bad checkpoint aside (kept for inspection, never loaded again)."""
        ...

    def purge(self, keep: int) -> list[int]:
        """Delete all but the newest ``keep`` checkpoints and any leftovers of crashed saves."""
        ...


class _HashingWriter(io.RawIOBase):
    """A write-only file that hashes what passes through, so the digest costs no second read of the payload."""

    def __init__(self, raw: BinaryIO) -> None:
        super().__init__()
        self._raw = raw
        self._hash = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._raw.write(view)
        self._hash.update(view)
        self.size += len(view)
        return len(view)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_sha256(path: Path) -> str:
    """SHA-256 of a file, read in large chunks."""
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(slots=True)
class LocalStorage:
    """``step-N`` folders in one directory."""

    root: Path

    def _step_dir(self, step: int) -> Path:
        return self.root / f"{_STEP_PREFIX}{step}"

    def committed_steps(self) -> list[int]:
        steps: list[int] = []
        if not self.root.is_dir():
            return steps
        for entry in self.root.iterdir():
            name = entry.name
            if name.startswith(_STEP_PREFIX) and name[len(_STEP_PREFIX):].isdigit() and (entry / MARKER).is_file():
                steps.append(int(name[len(_STEP_PREFIX):]))
        return sorted(steps, reverse=True)

    def write(self, step: int, write_payload: Callable[[BinaryIO], None], meta: Mapping[str, Any]) -> Manifest:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-{_STEP_PREFIX}{step}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            with open(tmp / PAYLOAD, "wb") as raw:
                writer = _HashingWriter(raw)
                write_payload(writer)  # type: ignore[arg-type]  # RawIOBase is a binary file
                raw.flush()
                os.fsync(raw.fileno())
            manifest = Manifest(
                step=step,
                sha256=writer.hexdigest(),
                size=writer.size,
                created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                meta=dict(meta),
            )
            with open(tmp / MARKER, "w") as f:
                json.dump({"step": step, "files": {PAYLOAD: {"sha256": manifest.sha256, "bytes": manifest.size}},
                           "created": manifest.created, "meta": manifest.meta}, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            _fsync_dir(tmp)
            final = self._step_dir(step)
            if final.exists():  # the same step saved again (e.g. after a fallback): replace it atomically enough
                old = self.root / f".old-{final.name}-{uuid.uuid4().hex[:8]}"
                final.rename(old)
                tmp.rename(final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                tmp.rename(final)
            _fsync_dir(self.root)
            return manifest
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def read_manifest(self, step: int) -> Manifest:
        """The parsed completion marker of ``step``."""
        with open(self._step_dir(step) / MARKER) as f:
            raw = json.load(f)
        entry = raw["files"][PAYLOAD]
        return Manifest(step=int(raw["step"]), sha256=str(entry["sha256"]), size=int(entry["bytes"]),
                        created=str(raw["created"]), meta=dict(raw.get("meta") or {}))

    def verify(self, step: int) -> str | None:
        try:
            manifest = self.read_manifest(step)
        except (OSError, ValueError, KeyError, TypeError) as err:
            return f"unreadable completion marker ({err})"
        path = self._step_dir(step) / PAYLOAD
        try:
            size = path.stat().st_size
            if size != manifest.size:
                return f"{PAYLOAD} has {size} bytes, the marker says {manifest.size}"
            digest = file_sha256(path)
        except OSError as err:
            return f"unreadable {PAYLOAD} ({err})"
        if digest != manifest.sha256:
            return f"checksum mismatch: {PAYLOAD} sha256 {digest[:12]}..., the marker says {manifest.sha256[:12]}..."
        return None

    def open_payload(self, step: int) -> BinaryIO:
        return open(self._step_dir(step) / PAYLOAD, "rb")

    def payload_path(self, step: int) -> Path:
        """The payload's path (torch.load reads a path faster than a file object)."""
        return self._step_dir(step) / PAYLOAD

    def quarantine(self, step: int, reason: str) -> None:
        src = self._step_dir(step)
        dst = self.root / f"corrupt-{src.name}-{int(time.time())}"
        with contextlib.suppress(FileNotFoundError):
            src.rename(dst)
            (dst / "REASON.txt").write_text(reason + "\n")

    def purge(self, keep: int) -> list[int]:
        removed = []
        for step in self.committed_steps()[keep:]:
            shutil.rmtree(self._step_dir(step), ignore_errors=True)
            removed.append(step)
        for leftover in self._leftovers():
            shutil.rmtree(leftover, ignore_errors=True)
        return removed

    def _leftovers(self) -> Iterator[Path]:
        # Only rank 0 writes and only one save runs at a time, so at purge time every temporary folder is the
        # remains of a save that crashed.
        if self.root.is_dir():
            for entry in self.root.iterdir():
                if entry.name.startswith((".tmp-", ".old-")):
                    yield entry

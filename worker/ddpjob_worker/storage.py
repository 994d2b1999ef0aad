"""Where checkpoints live: ``step-N`` folders that appear atomically and carry a checksummed completion marker.

A folder is written under a temporary name (payload -> fsync -> marker with the payload's SHA-256 -> fsync ->
rename -> fsync of the parent), so a crash at any instant leaves either the complete folder or none; a folder without
its marker, or whose payload no longer matches the marker's digest, is never loaded. The ``fence`` folder beside them
holds the fencing records (see fencing), one small file each. LocalStorage implements storage_api's ``Storage``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ddpjob_worker.fencing import FENCE_DIR, parse_record_name, record_name

# The interface this module implements, re-exported: these names have always been imported from here too.
from ddpjob_worker.storage_api import CorruptCheckpoint as CorruptCheckpoint
from ddpjob_worker.storage_api import Fence
from ddpjob_worker.storage_api import Manifest as Manifest
from ddpjob_worker.storage_api import Storage as Storage

#: The completion marker; its presence is what makes a step folder a checkpoint.
MARKER = "COMPLETE.json"
#: The serialized training state inside a step folder.
PAYLOAD = "state.pt"
#: Names the volume a checkpoint directory lives on: ranks that read the same id share their checkpoints.
VOLUME_ID = ".volume-id"
_STEP_PREFIX = "step-"
_CHUNK = 8 << 20


class _FollowingHasher:
    """SHA-256 of a file computed while another thread writes it: reads trail the writer through the page cache,
    so the digest costs no second pass over the disk and save speed stays at the disk's (torch.save releases the
    GIL while it writes). Valid because torch.save's zip writer only appends (tests/unit/worker checks that the
    streamed digest equals a fresh one)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._finished = threading.Event()
        self._hash = hashlib.sha256()
        self.size = 0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ddpjob-ckpt-hash", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._path.exists() and not self._finished.is_set():
                time.sleep(0.001)
            with open(self._path, "rb", buffering=0) as f:
                while True:
                    finished = self._finished.is_set()  # read before the last pass, so no tail is missed
                    chunk = f.read(_CHUNK)
                    if chunk:
                        self._hash.update(chunk)
                        self.size += len(chunk)
                    elif finished:
                        return
                    else:
                        time.sleep(0.002)
        except BaseException as err:
            self._error = err

    def hexdigest(self) -> str:
        """Wait for the writer's last byte and return the digest."""
        self._finished.set()
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._hash.hexdigest()


@contextlib.contextmanager
def _no_zip_crc32() -> Iterator[None]:
    """torch.save computes a CRC-32 per zip record, which makes it write at a quarter of the disk's speed; the
    completion marker's SHA-256 covers the whole file, so the record CRCs are redundant."""
    setter = getattr(torch.serialization, "set_crc32_options", None)
    getter = getattr(torch.serialization, "get_crc32_options", None)
    if setter is None or getter is None:
        yield
        return
    before = getter()
    setter(False)
    try:
        yield
    finally:
        setter(before)


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

    def write(self, step: int, state: Mapping[str, Any], meta: Mapping[str, Any], *,
              before_commit: Callable[[], None] | None = None) -> Manifest:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-{_STEP_PREFIX}{step}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            hasher = _FollowingHasher(tmp / PAYLOAD)
            try:
                with _no_zip_crc32():
                    torch.save(dict(state), tmp / PAYLOAD)
                # Flush while the hasher still reads the tail from the page cache: on a busy machine the SHA-256
                # lags the writer, and waiting for it before the fsync left the disk idle for that long.
                fd = os.open(tmp / PAYLOAD, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            finally:
                digest = hasher.hexdigest()
            manifest = Manifest(
                step=step,
                sha256=digest,
                size=hasher.size,
                created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                meta=dict(meta),
            )
            with open(tmp / MARKER, "w") as f:
                json.dump({"step": step, "files": {PAYLOAD: {"sha256": manifest.sha256, "bytes": manifest.size}},
                           "created": manifest.created, "meta": manifest.meta}, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            _fsync_dir(tmp)
            if before_commit is not None:
                before_commit()
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

    def read(self, step: int, map_location: Any, *, verify: bool) -> dict[str, Any]:
        # Hash in a thread while torch.load reads the same file: both passes share the page cache, so a
        # verified load costs little more than a plain one. Nothing is returned (or restored) unless it matches.
        result: list[str | None] = []
        checker = threading.Thread(target=lambda: result.append(self.verify(step)), daemon=True)
        if verify:
            checker.start()
        try:
            data: dict[str, Any] = torch.load(self._step_dir(step) / PAYLOAD, map_location=map_location,
                                              weights_only=True)
        except Exception as err:
            if verify:
                checker.join()
                if result and result[0] is not None:
                    raise CorruptCheckpoint(result[0]) from err
            raise CorruptCheckpoint(f"cannot load {PAYLOAD}: {err}") from err
        if verify:
            checker.join()
            if not result or result[0] is not None:
                raise CorruptCheckpoint(result[0] if result else "verification did not finish")
        return data

    def quarantine(self, step: int, reason: str, *, label: str = "corrupt") -> None:
        src = self._step_dir(step)
        dst = self.root / f"{label}-{src.name}-{int(time.time())}"
        with contextlib.suppress(FileNotFoundError):
            src.rename(dst)
            (dst / "REASON.txt").write_text(reason + "\n")

    def purge(self, keep: int, protect: int | None = None, valid: Callable[[int], bool] | None = None) -> list[int]:
        # A stale checkpoint (fenced) must not push a valid one out; resume sets it aside with its reason.
        steps = [step for step in self.committed_steps() if valid is None or valid(step)]
        # The step just written stays even when older runs left higher step numbers behind.
        kept = {protect} if protect in steps else set()
        for step in steps:
            if len(kept) >= keep:
                break
            kept.add(step)
        removed = [step for step in steps if step not in kept]
        for step in removed:
            shutil.rmtree(self._step_dir(step), ignore_errors=True)
        for leftover in self._leftovers():
            shutil.rmtree(leftover, ignore_errors=True)
        return removed

    def volume_id(self) -> str:
        path = self.root / VOLUME_ID
        with contextlib.suppress(FileNotFoundError):
            if existing := path.read_text().strip():
                return existing
        self.root.mkdir(parents=True, exist_ok=True)
        # Several processes may start at once on a shared volume: each writes a candidate and links it into place,
        # which succeeds for exactly one of them (link is atomic on NFS too, unlike O_EXCL on old servers).
        candidate = self.root / f"{VOLUME_ID}-{uuid.uuid4().hex}"
        candidate.write_text(uuid.uuid4().hex + "\n")
        try:
            with contextlib.suppress(FileExistsError):
                os.link(candidate, path)
        finally:
            candidate.unlink(missing_ok=True)
        return path.read_text().strip()

    def fences(self) -> list[Fence]:
        directory = self.root / FENCE_DIR
        if not directory.is_dir():
            return []
        found = [fence for entry in directory.iterdir() if (fence := parse_record_name(entry.name)) is not None]
        return sorted(found, key=lambda fence: fence.incarnation)

    def add_fence(self, fence: Fence) -> None:
        directory = self.root / FENCE_DIR
        directory.mkdir(parents=True, exist_ok=True)
        # Written aside, then linked into place: the record appears whole or not at all (link is atomic on NFS too),
        # and a record of that name already there is the same record, since the name is the record.
        candidate = directory / f".tmp-{uuid.uuid4().hex}"
        try:
            with open(candidate, "w") as f:
                json.dump({"incarnation": fence.incarnation, "resumed_from": fence.resumed_from,
                           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, f)
                f.flush()
                os.fsync(f.fileno())
            with contextlib.suppress(FileExistsError):
                os.link(candidate, directory / record_name(fence))
        finally:
            candidate.unlink(missing_ok=True)
        _fsync_dir(directory)
        _fsync_dir(self.root)

    def _leftovers(self) -> Iterator[Path]:
        # Only one rank writes to a volume and only one save runs at a time, so at purge time every temporary
        # folder is the remains of a save that crashed.
        if self.root.is_dir():
            for entry in self.root.iterdir():
                if entry.name.startswith((".tmp-", ".old-")):
                    yield entry

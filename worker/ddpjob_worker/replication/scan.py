"""The local side of replication: which files under the checkpoint folder this pod's processes have finished
writing. A file is *settled* once it is closed by every writer (no process of the container has it open for
writing: /proc/<pid>/fdinfo), unchanged for a quiet time, and whole by its format (units.whole); only settled files
are replicated, so a copy is never of a partial write. Linux only (/proc); elsewhere the quiet time alone decides.
"""

from __future__ import annotations

import hashlib
import os
import stat as stat_mod
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ddpjob_worker.replication import units
from ddpjob_worker.replication.ledger import Held, Stat

#: Seconds a closed file must stay unchanged before it is replicated: a writer that closes and reopens a file
#: (appends, a second pass over a header) is not caught half-way.
QUIET_SECONDS = 0.5
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR
HASH_CHUNK = 8 << 20


def stat_of(st: os.stat_result) -> Stat:
    return Stat(st.st_size, st.st_mtime_ns, st.st_ino)


def walk(root: Path) -> dict[str, os.stat_result]:
    """Every regular file and symbolic link under ``root`` that replication covers, by relative path (lstat)."""
    found: dict[str, os.stat_result] = {}
    skip_checkpointer = (root / units.CHECKPOINTER_VOLUME_ID).exists()
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        base = () if rel_dir == "." else tuple(Path(rel_dir).parts)
        keep = []
        for d in dirnames:
            if units.excluded((*base, d, "x")):
                continue
            if os.path.islink(os.path.join(dirpath, d)):
                filenames.append(d)  # a link to a folder is replicated as a link
                continue
            if skip_checkpointer and not base and units.CHECKPOINTER_NAMES.match(d):
                continue  # ddpjob_worker.checkpoint's own folders: its peer resume copies them
            keep.append(d)
        dirnames[:] = keep
        for name in filenames:
            parts = (*base, name)
            if units.excluded(parts):
                continue
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if stat_mod.S_ISREG(st.st_mode) or stat_mod.S_ISLNK(st.st_mode):
                found["/".join(parts)] = st
    return found


def open_for_writing(root: Path, proc: Path = Path("/proc")) -> set[str] | None:
    """Files under ``root`` that some process of this container has open for writing; None where /proc cannot
    tell (then the quiet time alone decides)."""
    prefix = str(root.resolve()) + os.sep
    found: set[str] = set()
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        fd_dir = proc / pid / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue  # gone, or not ours to read
        for fd in fds:
            try:
                target = os.readlink(fd_dir / fd)
            except OSError:
                continue
            if not target.startswith(prefix):
                continue
            try:
                flags = int((proc / pid / "fdinfo" / fd).read_text().split("flags:")[1].split()[0], 8)
            except (OSError, IndexError, ValueError):
                flags = _WRITE_FLAGS  # unreadable: assume the worst, it is re-checked next scan
            if flags & _WRITE_FLAGS:
                found.add(os.path.relpath(target, root.resolve()).replace(os.sep, "/"))
    return found


def sha256_of(path: Path) -> str:
    """The file's SHA-256, read in chunks (hashlib releases the GIL on each: training threads keep running)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass
class ScanResult:
    settled: dict[str, Stat] = field(default_factory=dict)
    """New writes that are finished: path -> the stat they were judged at."""
    links: dict[str, str] = field(default_factory=dict)
    """Settled symbolic links: path -> target."""
    deleted: list[str] = field(default_factory=list)
    """Paths this pod held that are gone."""
    partial: list[str] = field(default_factory=list)
    """Files present but not whole (only reported by a forced scan: nothing writes any more)."""


@dataclass
class Scanner:
    """Tells settled writes from writes in progress across successive scans."""

    root: Path
    quiet: float = QUIET_SECONDS
    clock: Callable[[], float] = time.monotonic
    writers: Callable[[Path], set[str] | None] = open_for_writing
    _pending: dict[str, tuple[Stat, float]] = field(default_factory=dict)

    def scan(self, held: Mapping[str, Held], force: bool = False) -> ScanResult:
        """Compare the folder with what this pod holds. ``force``: no process writes any more (the trainers are
        stopped), so every whole file settles now and every other one is partial."""
        now = self.clock()
        result = ScanResult()
        files = walk(self.root)
        writing = set() if force else self.writers(self.root)
        for path, st in files.items():
            current = stat_of(st)
            mine = held.get(path)
            if mine is not None and mine.stat == current:
                continue
            if stat_mod.S_ISLNK(st.st_mode):
                result.links[path] = os.readlink(self.root / path)
                result.settled[path] = current
                continue
            seen = self._pending.get(path)
            if seen is None or seen[0] != current:
                self._pending[path] = (current, now)
                if not force:
                    continue
            # A file whose format vouches for it (a zip's end record, a safetensors header, a JSON document) settles
            # once no process has it open; others need the quiet time too, as does everything where /proc cannot
            # tell who writes.
            vouched = writing is not None and units.self_checking(path, self.root)
            quiet_enough = force or vouched or now - self._pending[path][1] >= self.quiet
            if not quiet_enough or (writing is not None and path in writing):
                continue
            if units.whole(str(self.root / path), current.size):
                result.settled[path] = current
                del self._pending[path]
            elif force:
                result.partial.append(path)
        result.deleted = [p for p in held if p not in files]
        for gone in [p for p in self._pending if p not in files]:
            del self._pending[gone]
        return result

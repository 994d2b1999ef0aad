"""What the job holds of a script's checkpoint folder, as this pod knows it: the newest version of every file, what
this pod holds, and who else holds what. Pure bookkeeping (no I/O): the replicator feeds it local scans and what
peers announce, and asks it what to fetch and what to delete.

Versions are Lamport clocks per path: a pod that finds a new write (or a deletion) of a path gives it 1 + the
highest version of that path any pod has announced, so a file rewritten in place (the tutorial's ``snapshot.pt``,
``last.ckpt``) or deleted by its writer's rotation (Hugging Face's ``save_total_limit``) is ordered after every
copy of it, whichever pod wrote it. Ties (two pods writing one path unaware of each other) go to the origin's name,
so every pod picks the same winner.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class Entry:
    """One version of one file (or its deletion) under the checkpoint folder."""

    path: str
    """Relative to the checkpoint folder, with ``/``."""
    version: int
    origin: str
    """The pod that wrote or deleted it."""
    size: int = 0
    sha256: str = ""
    deleted: bool = False
    link: str = ""
    """A symbolic link's target (Lightning's ``save_last="link"``); empty for a regular file."""
    mtime_ns: int = 0
    """The writer's modification time: copies keep it, because frameworks pick "the latest" by it (Lightning's
    ``ckpt_path="last"``, Hugging Face's rotation)."""
    world: int = 0
    """The number of trainers of the group that wrote it (0: unknown): a checkpoint that should hold one file per
    rank (Hugging Face's ``rng_state_<rank>.pth``) is complete only with all of them."""

    def key(self) -> tuple[int, str]:
        return self.version, self.origin

    def newer_than(self, other: Entry | None) -> bool:
        return other is None or self.key() > other.key()

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in ("", False, 0) or k in ("path", "version")}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Entry:
        return cls(path=str(data["path"]), version=int(data["version"]), origin=str(data["origin"]),
                   size=int(data.get("size", 0)), sha256=str(data.get("sha256", "")),
                   deleted=bool(data.get("deleted", False)), link=str(data.get("link", "")),
                   mtime_ns=int(data.get("mtime_ns", 0)), world=int(data.get("world", 0)))


@dataclass(frozen=True, slots=True)
class Stat:
    """A local file as the scan saw it: a change of any field is a new write."""

    size: int
    mtime_ns: int
    ino: int


@dataclass(frozen=True, slots=True)
class Held:
    """A version this pod holds, and the local file it is (so the scan can tell our own copy from a new write)."""

    entry: Entry
    stat: Stat


class Ledger:
    """The newest version of every path, what this pod holds, and who holds which version."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.newest: dict[str, Entry] = {}
        self.held: dict[str, Held] = {}
        self.holders: dict[str, dict[str, tuple[int, str]]] = {}
        """path -> {peer: (version, origin) it holds}."""

    def _next_version(self, path: str) -> int:
        known = self.newest.get(path)
        mine = self.held.get(path)
        return 1 + max(known.version if known else 0, mine.entry.version if mine else 0)

    def local_write(self, path: str, stat: Stat, sha256: str, link: str = "", world: int = 0) -> Entry:
        """A write this pod's processes finished: a new version, held here (``world``: the trainers of the group
        that runs now)."""
        entry = Entry(path=path, version=self._next_version(path), origin=self.name, size=stat.size,
                      sha256=sha256, link=link, mtime_ns=stat.mtime_ns, world=world)
        self.newest[path] = entry
        self.held[path] = Held(entry, stat)
        return entry

    def local_delete(self, path: str) -> Entry:
        """A file this pod held is gone: its deletion is a new version, so the copies go too."""
        entry = Entry(path=path, version=self._next_version(path), origin=self.name, deleted=True)
        self.newest[path] = entry
        self.held.pop(path, None)
        return entry

    def received(self, entry: Entry, stat: Stat) -> None:
        """A copy of ``entry`` is now in place here."""
        self.held[entry.path] = Held(entry, stat)
        if entry.newer_than(self.newest.get(entry.path)):
            self.newest[entry.path] = entry

    def removed(self, path: str) -> None:
        """This pod deleted its copy (a tombstone, the keep bound or the sync's quarantine)."""
        self.held.pop(path, None)

    def learn(self, entries: Iterable[Entry], holder: str | None = None) -> list[Entry]:
        """Merge what a peer announced (``holder``: it holds every non-deleted entry); returns the newest entries
        that this pod does not match: files to fetch, deletions to apply."""
        changed = []
        for entry in entries:
            if holder is not None and not entry.deleted:
                self.holders.setdefault(entry.path, {})[holder] = entry.key()
            if entry.newer_than(self.newest.get(entry.path)):
                self.newest[entry.path] = entry
                changed.append(entry)
        return [e for e in changed if self.needs(e)]

    def forget_holder(self, holder: str) -> None:
        """A peer that is gone (or restarted: it announces itself again)."""
        for peers in self.holders.values():
            peers.pop(holder, None)

    def needs(self, entry: Entry) -> bool:
        """Whether this pod lags ``entry`` (the newest version of its path)."""
        held = self.held.get(entry.path)
        if entry.deleted:
            return held is not None and entry.newer_than(held.entry)
        return held is None or held.entry.key() != entry.key()

    def lagging(self) -> list[Entry]:
        """Every newest entry this pod does not match."""
        return [e for e in self.newest.values() if self.needs(e)]

    def holders_of(self, entry: Entry) -> list[str]:
        """Peers known to hold exactly ``entry``."""
        return sorted(p for p, key in self.holders.get(entry.path, {}).items() if key == entry.key())

    def inventory(self) -> list[Entry]:
        """What this pod holds, plus the deletions it knows (so a peer that missed a delete catches up)."""
        held = [h.entry for h in self.held.values()]
        gone = [e for e in self.newest.values() if e.deleted]
        return held + gone

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name,
                "held": [{**h.entry.to_json(), "stat": [h.stat.size, h.stat.mtime_ns, h.stat.ino]}
                         for h in self.held.values()],
                "newest": [e.to_json() for e in self.newest.values()]}

    def restore(self, data: Mapping[str, Any]) -> None:
        """Reload the state a previous start of this pod's agent saved (the folder survives a container restart)."""
        for item in data.get("newest") or []:
            entry = Entry.from_json(item)
            self.newest[entry.path] = entry
        for item in data.get("held") or []:
            size, mtime_ns, ino = item["stat"]
            self.held[item["path"]] = Held(Entry.from_json(item), Stat(size, mtime_ns, ino))


def renamed_origin(entry: Entry, origin: str) -> Entry:
    """``entry`` as written by ``origin`` (a restored checkpoint takes the restoring pod as its origin)."""
    return replace(entry, origin=origin)

"""The object-store tier (``spec.checkpoint.objectStore``): complete checkpoints uploaded in the background, so a
job whose pods all start fresh (every pod lost, a Kueue re-admission, the job deleted and created again) resumes
from its newest uploaded checkpoint instead of from nothing.

Layout under the job's prefix (``<prefix><namespace>/<job>/``):
- ``objects/<sha256>``: a file's bytes, named by its digest (a file rewritten in place never overwrites an object a
  restore may be reading, and a file in several checkpoints is stored once);
- ``units/<checkpoint path>.json``: one record per complete checkpoint, ``{"unit", "files": [entries]}``, written
  after its objects; a restore lists these, so there is no manifest for two uploaders to race on.

Who uploads: the pod of the group's rank 0 while it trains (ranks' pods hold the same checkpoints after the group
sync), and every pod once more when its agent exits (a SIGTERM checkpoint, a preemption's last one). A training
step never waits: uploads run on a thread of the agent. The Checkpointer's own ``step-N`` folders (ddpjob_worker.
checkpoint) are uploaded and restored too; they are not replicated between pods (they have their own peer path).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from ddpjob_worker.logs import get_logger
from ddpjob_worker.replication import scan, units
from ddpjob_worker.replication.ledger import Entry
from ddpjob_worker.replication.replicator import STATE_DIR, Replicator, checkpointer_units, judge_all

log = get_logger("replication.tier")

UPLOAD_SECONDS = 2.0
#: Objects no record names are deleted only this long after their upload: another pod's upload in flight may be
#: about to write the record that names them.
GC_AGE_SECONDS = 600.0


class Tier:
    """One pod's uploads to and restores from the job's object store."""

    def __init__(self, rep: Replicator, store: Any) -> None:
        self.rep = rep
        self.store = store
        self.uploading = threading.Event()
        """Set while this pod is the group's rank 0 (groupsync sets it after each sync)."""
        self.uploaded: dict[str, frozenset[tuple[str, str]]] = {}
        """unit -> (path, sha256) of what its record holds, as this pod last wrote or read it."""
        self._units: dict[str, list[Entry]] | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        threading.Thread(target=self._loop, name="ddpjob-replica-tier", daemon=True).start()

    def _loop(self) -> None:
        while not self.rep.stopped.wait(UPLOAD_SECONDS):
            if self.uploading.is_set() and not self.rep.paused.is_set():
                self.upload_pending()

    # --- what is complete here --------------------------------------------------------------------------------
    def local_units(self) -> dict[str, list[Entry]]:
        """The complete checkpoints this pod holds in full: the replicated ones and the Checkpointer's folders."""
        with self.rep.lock:
            held = [h.entry for h in self.rep.ledger.held.values()]
            newest = list(self.rep.ledger.newest.values())
        judged = judge_all(newest)
        mine = {e.path: e for e in held}
        found: dict[str, list[Entry]] = {}
        for unit, j in judged.items():
            files = [e for e in newest if not e.deleted and units.unit_of(e.path) == unit]
            if j.complete and files and all(mine.get(e.path) == e for e in files) and not any(e.link for e in files):
                found[unit] = files
        found.update(self._checkpointer_units())
        return found

    def _checkpointer_units(self) -> dict[str, list[Entry]]:
        root = self.rep.root
        found = {}
        for name in checkpointer_units(root):
            folder = root / name
            files = []
            for f in sorted(p for p in folder.rglob("*") if p.is_file()):
                rel = f.relative_to(root).as_posix()
                files.append(Entry(path=rel, version=1, origin=self.rep.name, size=f.stat().st_size,
                                   sha256=_cached_sha(f)))
            found[units.CHECKPOINTER_UNIT + folder.name] = files
        return found

    # --- uploads ----------------------------------------------------------------------------------------------
    def upload_pending(self, deadline: float | None = None) -> int:
        """Upload every complete checkpoint not in the store yet, newest first; returns how many were uploaded."""
        done = 0
        with self._lock:
            pending = {u: fs for u, fs in self.local_units().items()
                       if self.uploaded.get(u) != frozenset((e.path, e.sha256) for e in fs)}
            for unit in sorted(pending, key=lambda u: units.order_of(u), reverse=True):
                if deadline is not None and time.monotonic() > deadline:
                    break
                try:
                    self._upload(unit, pending[unit])
                    done += 1
                except Exception as err:
                    log.warning("uploading checkpoint %s to the object store failed (retried): %s", unit, err)
                    break
            if done:
                self._trim()
        return done

    def _upload(self, unit: str, files: Sequence[Entry]) -> None:
        t0 = time.monotonic()
        size = 0
        for e in files:
            key = f"objects/{e.sha256}"
            if not self.store.exists(key):
                self.store.put_file(self.rep.root / e.path, key)
                size += e.size
        self.store.put_json(_record_key(unit), {"unit": unit, "files": [e.to_json() for e in files],
                                                "uploader": self.rep.name, "time": time.time()})
        self.uploaded[unit] = frozenset((e.path, e.sha256) for e in files)
        log.info("checkpoint %s uploaded to the object store (%d files, %d new bytes, %.1f s)", unit, len(files),
                 size, time.monotonic() - t0)

    def _trim(self) -> None:
        """Keep the newest ``keep`` checkpoints of each family in the store; delete objects nothing names."""
        records = self._list_records()
        by_family: dict[tuple[str, str], list[str]] = {}
        for unit in records:
            if units.numbered(unit):
                by_family.setdefault(units.family_of(unit), []).append(unit)
        old = [u for members in by_family.values()
               for u in sorted(members, key=units.order_of, reverse=True)[self.rep.keep:]]
        if old:
            self.store.delete(_record_key(u) for u in old)
            for u in old:
                self.uploaded.pop(u, None)
                records.pop(u, None)
        named = {f"objects/{e['sha256']}" for r in records.values() for e in r.get("files") or []}
        stale = [k for k, age in self.store.list_ages("objects/").items() if k not in named and age > GC_AGE_SECONDS]
        if stale:
            self.store.delete(stale)

    def _list_records(self) -> dict[str, dict[str, Any]]:
        out = {}
        for key in self.store.list_keys("units/"):
            record = self.store.get_json(key)
            if isinstance(record, dict) and record.get("unit"):
                out[str(record["unit"])] = record
        return out

    def flush(self, seconds: float) -> None:
        """At the agent's exit: upload what is complete and not uploaded yet, within ``seconds``."""
        with contextlib.suppress(Exception):
            n = self.upload_pending(deadline=time.monotonic() + seconds)
            if n:
                log.info("uploaded %d checkpoint(s) to the object store before exiting", n)

    # --- restores (groupsync.Remote) ---------------------------------------------------------------------------
    def units(self) -> Mapping[str, Sequence[Entry]]:
        """The store's complete checkpoints (read once per sync)."""
        try:
            records = self._list_records()
        except Exception as err:
            log.warning("cannot list the object store's checkpoints (restores skipped): %s", err)
            return {}
        self._units = {u: [Entry.from_json(e) for e in r.get("files") or []] for u, r in records.items()}
        for unit, files in self._units.items():
            self.uploaded[unit] = frozenset((e.path, e.sha256) for e in files)
        return self._units

    def restore(self, entry: Entry) -> bool:
        """Download ``entry`` into place (a Checkpointer folder's file straight to its path)."""
        staged = self.rep.root / STATE_DIR / "incoming" / f"s3-{secrets.token_hex(6)}"
        try:
            self.store.get_file(f"objects/{entry.sha256}", staged)
        except Exception as err:
            log.warning("restoring %s from the object store failed: %s", entry.path, err)
            staged.unlink(missing_ok=True)
            return False
        if scan.sha256_of(staged) != entry.sha256:
            staged.unlink(missing_ok=True)
            return False
        if units.CHECKPOINTER_UNIT + entry.path.split("/", 1)[0] in (self._units or {}):
            target = self.rep.root / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged, target)
            return True
        with self.rep.lock:
            self.rep.ledger.newest[entry.path] = entry
        return self.rep.place(entry, staged)


def _record_key(unit: str) -> str:
    return f"units/{quote(unit, safe='')}.json"


def unit_from_key(key: str) -> str:
    return unquote(key.removeprefix("units/").removesuffix(".json"))


_SHA_CACHE: dict[tuple[str, int, int], str] = {}


def _cached_sha(path: Path) -> str:
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _SHA_CACHE:
        _SHA_CACHE[key] = scan.sha256_of(path)
    return _SHA_CACHE[key]

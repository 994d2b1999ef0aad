"""Replication of whatever a training script writes under the checkpoint folder, to every other pod of the job
(hot spares included), so a pod that is lost takes no checkpoint with it: docs/checkpoints.md, "Your framework's
checkpoints". One Replicator runs in each pod's agent (ddpjob_worker.launch), beside torchrun:

- a scan every SCAN_SECONDS finds the writes this pod's processes finished (scan.Scanner) and deletions, gives each
  a version (ledger.Ledger) and announces it to the peers;
- a fetch thread copies the versions peers announce: staged under a hidden name in the folder, checked against
  their size and SHA-256, fsynced and renamed into place, so a copy appears only whole;
- every POLL_SECONDS it asks each peer for its inventory, which repairs a missed announcement and finds new peers.

Bounds: received copies are kept for the newest ``keep`` complete checkpoints of each family only; ``budget``
bytes of received copies per pod at most (the oldest checkpoints' copies go first, the newest complete one of each
family never; past that a copy is not taken and the log says so once). A file this pod's own processes wrote is
never deleted by these bounds, only by its writer (whose deletion then reaches every copy).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from ddpjob_worker.logs import get_logger
from ddpjob_worker.replication import scan, transport, units
from ddpjob_worker.replication.ledger import Entry, Ledger

log = get_logger("replication")

SCAN_SECONDS = 0.5
POLL_SECONDS = 10.0
#: The runtime's own state in the folder (hidden: never replicated, survives a container restart).
STATE_DIR = ".ddpjob-replica"


class Replicator:
    """One pod's side of the job's checkpoint replication."""

    def __init__(self, root: Path, name: str, job: str, peers: Callable[[], Sequence[str]], *,
                 keep: int = 3, budget: int = 0, quiet: float = scan.QUIET_SECONDS) -> None:
        self.root = root
        self.name = name
        self.job = job
        self.peer_addresses = peers
        self.keep = keep
        self.budget = budget
        self.ledger = Ledger(name)
        self.scanner = scan.Scanner(root, quiet=quiet)
        self.lock = threading.RLock()
        self.fetches: queue.Queue[Entry] = queue.Queue()
        self.paused = threading.Event()
        self.stopped = threading.Event()
        self.peer_names: dict[str, str] = {}
        """address -> pod name, for the peers that answered; shared volumes (same volume id) are left out."""
        self.volume = ""
        self.address = ""
        self.world = 0
        """Trainers of the group that runs now (set by each group sync): recorded with what they write."""
        self._server: Any = None
        self._dirty = False
        self._warned: set[str] = set()

    # --- life cycle -------------------------------------------------------------------------------------------
    def start(self, host: str, port: int, advertise: str = "") -> None:
        """Serve on ``host:port`` (0: any free port) and start the loops; peers reach this pod at ``advertise``
        (default: ``host``)."""
        (self.root / STATE_DIR / "incoming").mkdir(parents=True, exist_ok=True)
        self.volume = self._volume_id()
        self._load()
        self._server, bound = transport.serve(self, self.job, host, port)
        self.address = f"{advertise or host}:{bound}"
        for target, name in ((self._scan_loop, "scan"), (self._fetch_loop, "fetch"), (self._poll_loop, "poll")):
            threading.Thread(target=target, name=f"ddpjob-replica-{name}", daemon=True).start()
        log.info("replicating %s to the job's other pods (port %d, keep %d%s)", self.root, bound, self.keep,
                 f", budget {self.budget} bytes" if self.budget else "")

    def stop(self) -> None:
        self.stopped.set()
        if self._server is not None:
            self._server.shutdown()
        self._save(force=True)

    def _volume_id(self) -> str:
        """A random id of this folder: pods that share one volume see the same id and do not copy to each other."""
        path = self.root / STATE_DIR / "volume-id"
        with contextlib.suppress(FileExistsError):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, secrets.token_hex(8).encode())
            os.close(fd)
        return path.read_text().strip()

    def _load(self) -> None:
        with contextlib.suppress(OSError, ValueError, KeyError):
            self.ledger.restore(json.loads((self.root / STATE_DIR / "state.json").read_text()))

    def _save(self, force: bool = False) -> None:
        if not (self._dirty or force):
            return
        with self.lock:
            data = json.dumps(self.ledger.to_json())
            self._dirty = False
        tmp = self.root / STATE_DIR / f"state.json.{os.getpid()}"
        with contextlib.suppress(OSError):
            tmp.write_text(data)
            os.replace(tmp, self.root / STATE_DIR / "state.json")

    # --- the server's side (transport.Source) ------------------------------------------------------------------
    def inventory(self) -> dict[str, Any]:
        with self.lock:
            entries = [e.to_json() for e in self.ledger.inventory()]
        return {"name": self.name, "volume": self.volume, "address": self.address, "entries": entries}

    def announced(self, data: Mapping[str, Any]) -> None:
        self.learn(data, holder=str(data.get("address") or ""))

    def open_version(self, path: str, version: int, origin: str) -> tuple[BinaryIO, int, str] | None:
        with self.lock:
            held = self.ledger.held.get(path)
            if held is None or held.entry.key() != (version, origin) or held.entry.link:
                return None
            try:
                f = open(self.root / path, "rb")  # noqa: SIM115 - the server closes it after sending
            except OSError:
                return None
            if scan.stat_of(os.fstat(f.fileno())) != held.stat:
                f.close()
                return None
            return f, held.entry.size, held.entry.sha256

    def learn(self, data: Mapping[str, Any], holder: str = "") -> None:
        """Merge a peer's inventory or announcement; queue what this pod lags."""
        if data.get("volume") and data.get("volume") == self.volume:
            return  # the same volume as ours: nothing to copy
        if holder:
            self.peer_names[holder] = str(data.get("name") or holder)
        entries = [Entry.from_json(e) for e in data.get("entries") or []]
        with self.lock:
            for entry in self.ledger.learn(entries, holder or None):
                self.fetches.put(entry)

    # --- local scans -------------------------------------------------------------------------------------------
    def scan_once(self, force: bool = False) -> scan.ScanResult:
        """Record the writes and deletions this pod's processes made; announce them."""
        with self.lock:
            held = dict(self.ledger.held)
        result = self.scanner.scan(held, force=force)
        new: list[Entry] = []
        for path, st in result.settled.items():
            link = result.links.get(path, "")
            sha = "" if link else self._digest(path, st)
            if sha is None:
                continue  # changed while hashed: the next scan sees it again
            with self.lock:
                new.append(self.ledger.local_write(path, st, sha, link, self.world))
        with self.lock:
            new += [self.ledger.local_delete(p) for p in result.deleted if p in self.ledger.held]
        if new:
            self._dirty = True
            self._announce(new)
        return result

    def _digest(self, path: str, st: Any) -> str | None:
        try:
            sha = scan.sha256_of(self.root / path)
            return sha if scan.stat_of(os.lstat(self.root / path)) == st else None
        except OSError:
            return None

    def _announce(self, entries: Iterable[Entry]) -> None:
        body = {"name": self.name, "volume": self.volume, "address": self.address,
                "entries": [e.to_json() for e in entries]}
        for address in self.peers():
            threading.Thread(target=self._post, args=(address, body), daemon=True).start()

    def _post(self, address: str, body: Mapping[str, Any]) -> None:
        with contextlib.suppress(transport.TransferError):
            transport.request_json(address, self.job, "POST", "/v1/announce", body, timeout=3.0)

    def peers(self) -> list[str]:
        """Addresses of the other pods' replicators (those known to be another volume, or not yet asked)."""
        return [a for a in self.peer_addresses() if a != self.address and self.peer_names.get(a) != self.name]

    # --- background loops ---------------------------------------------------------------------------------------
    def _scan_loop(self) -> None:
        while not self.stopped.wait(SCAN_SECONDS):
            if self.paused.is_set():
                continue
            try:
                self.scan_once()
                self.prune()
                self._save()
            except Exception as err:  # never let the thread die: replication is best effort between syncs
                self._warn("scan", f"scanning {self.root} failed: {type(err).__name__}: {err}")

    def _poll_loop(self) -> None:
        while not self.stopped.is_set():
            self.poll()
            self.stopped.wait(POLL_SECONDS)

    def poll(self) -> dict[str, dict[str, Any]]:
        """Ask every peer for its inventory; returns them by address (those that answered)."""
        answers: dict[str, dict[str, Any]] = {}
        for address in self.peers():
            try:
                data = transport.request_json(address, self.job, "GET", "/v1/inventory", timeout=3.0)
            except transport.TransferError:
                with self.lock:
                    self.ledger.forget_holder(address)
                continue
            if data.get("name") == self.name:
                self.peer_names[address] = self.name  # our own address as the Service lists it
                continue
            self.learn(data, holder=address)
            answers[address] = data
        return answers

    def _fetch_loop(self) -> None:
        while not self.stopped.is_set():
            try:
                entry = self.fetches.get(timeout=1.0)
            except queue.Empty:
                continue
            while self.paused.is_set() and not self.stopped.is_set():
                time.sleep(0.2)
            try:
                self.bring(entry)
            except Exception as err:
                self._warn(f"fetch:{entry.path}", f"copying {entry.path} failed: {type(err).__name__}: {err}")

    # --- applying what peers have -------------------------------------------------------------------------------
    def bring(self, entry: Entry, holders: Sequence[str] = ()) -> bool:
        """Make this pod match ``entry`` (fetch it, or apply its deletion) if it is still the newest version and
        within the bounds; True when it matches afterwards."""
        with self.lock:
            if self.ledger.newest.get(entry.path) != entry or not self.ledger.needs(entry):
                return not self.ledger.needs(entry)
            if entry.deleted:
                self.remove(entry.path)
                return True
            if not self._within_bounds(entry):
                return False
            holders = list(holders) or self.ledger.holders_of(entry)
        if entry.link:
            return self._place_link(entry)
        for address in holders:
            staged = self.root / STATE_DIR / "incoming" / f"{secrets.token_hex(6)}"
            try:
                transport.fetch(address, self.job, entry, staged)
            except transport.TransferError as err:
                log.debug("fetch of %s from %s failed: %s", entry.path, address, err)
                continue
            return self.place(entry, staged)
        return False

    def place(self, entry: Entry, staged: Path) -> bool:
        with self.lock:
            if self.ledger.newest.get(entry.path) != entry:
                staged.unlink(missing_ok=True)
                return False  # superseded while it came
            target = self.root / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            if entry.mtime_ns:
                os.utime(staged, ns=(entry.mtime_ns, entry.mtime_ns))
            os.replace(staged, target)
            _fsync_dir(target.parent)
            self.ledger.received(entry, scan.stat_of(os.lstat(target)))
            self._folder_times(target.parent)
            self._dirty = True
        return True

    def _folder_times(self, folder: Path) -> None:
        """Give a folder the newest modification time of what this pod holds in it, as its writer's folder has
        (Hugging Face rotates ``checkpoint-N`` folders by it); a copy's arrival would make it "now"."""
        rel = folder.relative_to(self.root).as_posix()
        times = [h.entry.mtime_ns for p, h in self.ledger.held.items()
                 if p.rsplit("/", 1)[0] == rel and h.entry.mtime_ns]
        if times and folder != self.root:
            with contextlib.suppress(OSError):
                os.utime(folder, ns=(max(times), max(times)))

    def prune(self) -> None:
        """Drop this pod's copies of numbered checkpoints past ``keep`` (its own writes stay: their writer rotates
        them)."""
        with self.lock:
            kept = self.kept_units()
            for path, held in list(self.ledger.held.items()):
                unit = units.unit_of(path)
                if held.entry.origin != self.name and units.numbered(unit) and unit not in kept:
                    self.remove(path)

    def _place_link(self, entry: Entry) -> bool:
        with self.lock:
            target = self.root / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            staged = target.parent / f".ddpjob-link-{secrets.token_hex(4)}"
            os.symlink(entry.link, staged)
            os.replace(staged, target)
            self.ledger.received(entry, scan.stat_of(os.lstat(target)))
            self._dirty = True
        return True

    def remove(self, path: str) -> None:
        """Delete this pod's copy of ``path`` and the folders that leaves empty (caller holds the lock)."""
        target = self.root / path
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
        self.ledger.removed(path)
        self._dirty = True
        parent = target.parent
        while parent != self.root and self.root in parent.parents:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    def _within_bounds(self, entry: Entry) -> bool:
        """``keep`` and the byte budget, for a copy of ``entry`` (caller holds the lock)."""
        unit = units.unit_of(entry.path)
        if units.numbered(unit) and unit not in self.kept_units():
            return False
        if not self.budget:
            return True
        used = sum(h.entry.size for h in self.ledger.held.values() if h.entry.origin != self.name)
        if used + entry.size <= self.budget:
            return True
        self._warn("budget", f"not copying {entry.path} ({entry.size} bytes): this pod's copies of other pods' "
                             f"checkpoints would pass the budget of {self.budget} bytes")
        return False

    def kept_units(self) -> set[str]:
        """The numbered checkpoints copies are kept of: per family, the newest ``keep`` complete ones and any newer
        one still being written (caller holds the lock)."""
        judged = judge_all(self.ledger.newest.values())
        kept: set[str] = set()
        by_family: dict[tuple[str, str], list[str]] = {}
        for unit in judged:
            if units.numbered(unit):
                by_family.setdefault(units.family_of(unit), []).append(unit)
        for members in by_family.values():
            members.sort(key=units.order_of, reverse=True)
            complete = [u for u in members if judged[u].complete]
            oldest_kept = complete[: self.keep][-1] if complete else None
            kept.update(u for u in members if oldest_kept is None or units.order_of(u) >= units.order_of(oldest_kept))
        return kept

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s", message)


def checkpointer_units(root: Path) -> list[str]:
    """The complete ``step-N`` folders of ddpjob_worker.checkpoint in ``root`` (a Checkpointer volume), if any."""
    if not (root / units.CHECKPOINTER_VOLUME_ID).exists():
        return []
    return sorted(d.name for d in root.glob("step-*") if (d / units.CHECKPOINTER_MARKER).is_file())


def judge_all(entries: Iterable[Entry], partial: Iterable[str] = ()) -> dict[str, units.Judgement]:
    """Every checkpoint the entries make up, judged (deleted entries left out)."""
    files: dict[str, list[str]] = {}
    world: dict[str, int] = {}
    for e in entries:
        if not e.deleted:
            unit = units.unit_of(e.path)
            files.setdefault(unit, []).append(e.path)
            world[unit] = max(world.get(unit, 0), e.world)
    broken: dict[str, list[str]] = {}
    for p in partial:
        broken.setdefault(units.unit_of(p), []).append(p)
        files.setdefault(units.unit_of(p), [])
    return {u: units.judge(u, fs, broken.get(u, ()), world.get(u, 0)) for u, fs in files.items()}


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

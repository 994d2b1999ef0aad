"""Before a process group starts (a first start, a restart in place, a replacement or a hot spare joining), every
pod of the group holds the same checkpoints: the newest complete checkpoint of each family that any pod of the job
holds, every other file's newest whole version, and no partial checkpoint. A script that resumes collectively
(every rank loads the path its own ``get_last_checkpoint`` finds, as the Hugging Face Trainer does) then loads the
same checkpoint on every rank, whichever pods were lost.

The agents of the new round exchange inventories through the round's rendezvous store, each computes the same plan
from the same union (plan_sync, pure), quarantines what is partial, fetches what it lacks from a pod that has it
(or from the object store, ddpjob_worker.replication.tier), and reports; the group starts once every pod reported
done. The wait is bounded (contract.DDPJOB_REPLICA_SYNC_SECONDS); past it the agent fails with a message naming the
missing file, the pod that lacks it and the pods that hold it, which the operator puts in the job's Event.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

from ddpjob_worker import contract
from ddpjob_worker.logs import get_logger
from ddpjob_worker.replication import units
from ddpjob_worker.replication.ledger import Entry
from ddpjob_worker.replication.replicator import STATE_DIR, Replicator, checkpointer_units, judge_all

log = get_logger("replication")

KEY = "ddpjob/replica"


class SyncFailed(Exception):
    """The group could not agree on its checkpoints in time; the message names what is missing where."""


class Store(Protocol):
    """What the sync needs of the round's c10d store."""

    def set(self, key: str, value: str | bytes) -> None: ...

    def get(self, key: str) -> bytes: ...

    def wait(self, keys: list[str], timeout: timedelta) -> None: ...

    def check(self, keys: list[str]) -> bool: ...


class Remote(Protocol):
    """The object store's view for the sync (tier.Tier): its newest checkpoints, and getting one's files."""

    def units(self) -> Mapping[str, Sequence[Entry]]: ...

    def restore(self, entry: Entry) -> bool: ...


@dataclass
class SyncPlan:
    """What one pod does before the group starts (the same lists on every pod, applied to its own folder)."""

    delete: list[str] = field(default_factory=list)
    """Partial checkpoints' files: deleted on every pod (as deletions: the copies go too)."""
    required: list[Entry] = field(default_factory=list)
    """Files every pod must hold before the group starts."""
    remote: list[Entry] = field(default_factory=list)
    """Files of a checkpoint newer than any pod holds, restored from the object store."""
    resume: dict[str, str] = field(default_factory=dict)
    """Per family, the checkpoint the group resumes from (for the log)."""


def plan_sync(newest: Mapping[str, Entry], partial: Iterable[str],
              remote: Mapping[str, Sequence[Entry]] | None = None, checkpointer: Iterable[str] = ()) -> SyncPlan:
    """The group's plan from the union of what its pods hold (``newest``: the newest version of every path, as
    merged from every inventory; ``partial``: files some pod has only as a partial write; ``checkpointer``: the
    Checkpointer's complete ``step-N`` folders any pod holds) and the object store's complete checkpoints
    (``remote``: unit -> its files)."""
    plan = SyncPlan()
    remote = dict(remote or {})
    own = [u for u in remote if u.startswith(units.CHECKPOINTER_UNIT)]
    if own:  # the Checkpointer's folders: restored only when newer than every pod's (its own resume does the rest)
        newest_local = max((units.order_of(u) for u in checkpointer), default=())
        newest_remote = max(own, key=units.order_of)
        for u in own:
            files = remote.pop(u)
            if u == newest_remote and units.order_of(u) > newest_local:
                plan.remote.extend(files)
                plan.resume["checkpointer"] = u.removeprefix(units.CHECKPOINTER_UNIT)
    live = [e for e in newest.values() if not e.deleted]
    whole = {e.path for e in live}
    judged = judge_all(live, [p for p in partial if p not in whole])
    best = units.newest_complete(judged)
    chosen_remote: set[str] = set()
    for unit in remote:  # the object store's, where it is newer than any pod's
        fam = units.family_of(unit)
        if units.numbered(unit) and (fam not in best or units.order_of(unit) > units.order_of(best[fam])):
            best[fam] = unit
        elif not units.numbered(unit) and not any(e.path in whole for e in remote[unit]):
            chosen_remote.add(unit)
    chosen_remote.update(u for u in best.values() if u in remote and not (u in judged and judged[u].complete))
    plan.remote.extend(e for u in sorted(chosen_remote) for e in remote[u])
    for unit, judgement in judged.items():
        fam = units.family_of(unit)
        newer_than_best = fam not in best or units.order_of(unit) >= units.order_of(best[fam])
        if not judgement.complete and (newer_than_best or not units.numbered(unit)):
            plan.delete.extend(sorted(p for p in whole if units.unit_of(p) == unit))
            if judgement.why:
                log.warning("checkpoint %s is not complete (%s): set aside on every pod", unit, judgement.why)
    chosen = set(best.values())
    plan.required = sorted((e for e in live if e.path not in plan.delete
                            and (units.unit_of(e.path) in chosen or not units.numbered(units.unit_of(e.path)))),
                           key=lambda e: e.path)
    plan.resume.update({"/".join(f).strip("/"): u for f, u in best.items()})
    return plan


def sync(rep: Replicator, store: Store, rank: int, world: int, remote: Remote | None = None,
         timeout: float | None = None) -> SyncPlan:
    """Run the group's sync on this pod (every agent of the round calls it once, after the rendezvous)."""
    if timeout is None:
        timeout = float(os.environ.get(contract.DDPJOB_REPLICA_SYNC_SECONDS, contract.DEFAULT_REPLICA_SYNC_SECONDS))
    deadline = time.monotonic() + timeout
    rep.paused.set()
    try:
        result = rep.scan_once(force=True)
        _set_aside(rep, result.partial)
        own = checkpointer_units(rep.root)
        store.set(f"{KEY}/inventory/{rank}",
                  json.dumps({**rep.inventory(), "partial": result.partial, "checkpointer": own}))
        peers = _gather(store, "inventory", world, deadline, rank)
        partial, steps = list(result.partial), set(own)
        for data in peers:
            rep.learn(data, holder=str(data.get("address") or ""))
            partial += list(data.get("partial") or ())
            steps.update(data.get("checkpointer") or ())
        with rep.lock:
            newest = dict(rep.ledger.newest)
        plan = plan_sync(newest, partial, remote.units() if remote is not None else None, steps)
        missing = _apply(rep, plan, remote)
        store.set(f"{KEY}/done/{rank}", json.dumps({"name": rep.name, "missing": missing}))
        done = _gather(store, "done", world, deadline, rank)
    finally:
        rep.paused.clear()
    lacking = [(d.get("name", "?"), m) for d in [{"name": rep.name, "missing": missing}, *done]
               for m in d.get("missing") or []]
    if lacking:
        pod, item = lacking[0]
        raise SyncFailed(f"checkpoint sync: {pod} could not get {item['path']} (held by "
                         f"{', '.join(item['holders']) or 'no reachable pod'}); {len(lacking)} file(s) missing")
    log.info("checkpoints agreed by the %d pods of the group: resuming from %s", world,
             ", ".join(plan.resume.values()) or "nothing (no complete checkpoint yet)")
    return plan


def _set_aside(rep: Replicator, partial: Sequence[str]) -> None:
    """Move this pod's partial writes out of the script's sight (kept under the runtime's folder for a look)."""
    if not partial:
        return
    aside = rep.root / STATE_DIR / "partial" / time.strftime("%Y%m%dT%H%M%S")
    for path in partial:
        target = aside / path
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(rep.root / path, target)
        except OSError:
            continue
        with rep.lock:
            rep.ledger.removed(path)
        log.warning("%s is a partial write (its writer stopped before finishing it): moved to %s", path, target)


def _apply(rep: Replicator, plan: SyncPlan, remote: Remote | None) -> list[dict[str, Any]]:
    """Delete, fetch and restore this pod's part of the plan; returns what it could not get."""
    with rep.lock:
        for path in plan.delete:
            if path in rep.ledger.held:
                rep.remove(path)
            rep.ledger.newest[path] = Entry(path=path, version=_next(rep, path), origin=f"sync:{path}",
                                            deleted=True)
    missing = []
    for entry in plan.required:
        with rep.lock:
            if not rep.ledger.needs(entry):
                continue
            holders = rep.ledger.holders_of(entry)
        if not rep.bring(entry, holders):
            missing.append({"path": entry.path, "holders": [rep.peer_names.get(h, h) for h in holders]})
    for entry in plan.remote:
        with rep.lock:
            if not rep.ledger.needs(entry):
                continue
        if remote is None or not remote.restore(entry):
            missing.append({"path": entry.path, "holders": ["the object store"]})
    return missing


def _next(rep: Replicator, path: str) -> int:
    known = rep.ledger.newest.get(path)
    return 1 + (known.version if known else 0)


def _gather(store: Store, what: str, world: int, deadline: float, rank: int) -> list[dict[str, Any]]:
    """Every other rank's value of ``what``, waiting until the deadline at most."""
    keys = [f"{KEY}/{what}/{r}" for r in range(world) if r != rank]
    remaining = max(0.1, deadline - time.monotonic())
    try:
        store.wait(keys, timedelta(seconds=remaining))
    except Exception as err:  # the store's timeout: name the ranks that did not report
        late = [k.rsplit("/", 1)[1] for k in keys if not _has(store, k)]
        raise SyncFailed(f"checkpoint sync: rank(s) {', '.join(late)} of the group did not report their "
                         f"{what} within the sync's bound ({type(err).__name__})") from err
    return [json.loads(store.get(k)) for k in keys]


def _has(store: Store, key: str) -> bool:
    try:
        return bool(store.check([key]))
    except Exception:
        return False

"""The operator's view of every DDPJob's children, fed by watch events and corrected by periodic re-lists.

kopf's own indices only add what a (re-)listing yields: a pod deleted while a watch was down (an API server
restart) stays in them for ever, and the job waits on a ghost. This cache is an informer with resync instead:
``apply`` takes watch events, ``resync`` takes a full LIST and drops what the API server no longer has (unless
a watch event that arrived after the LIST began says otherwise). A pod that disappears becomes a *tombstone* for a
while, so the planner can count a loss it never saw Terminating (a force delete, a deletion during a watch outage).

Which of a watch event and a LIST item is newer is decided by arrival, never by comparing resourceVersions (the API
conventions make them opaque strings): the caller takes :meth:`ChildCache.mark` before it sends the LIST, and an
object a watch event touched after the mark keeps the watch's version. A watch delivers each object's changes in
order, and the LIST began after every event before the mark, so it is at least as new as those.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from ddpjob_operator.api import names
from ddpjob_operator.planner.observation import ChildView, PodView

Key = tuple[str, str]
"""(namespace, job name)."""
Listed = tuple[Key, PodView | ChildView]
"""A LIST item as the cache keeps it: its job and its view."""

#: How long a deleted pod is remembered as a tombstone (long enough for a few passes to count it).
TOMBSTONE_SECONDS = 300.0


@dataclasses.dataclass
class _Tomb:
    view: PodView
    at: float


def job_key(obj: Mapping[str, Any]) -> Key | None:
    """(namespace, job) from an object's job-name label, or None if it has none."""
    meta = obj.get("metadata") or {}
    job = (meta.get("labels") or {}).get(names.LABEL_JOB_NAME)
    return (str(meta.get("namespace") or ""), str(job)) if job else None


def listed(kind: str, obj: Mapping[str, Any]) -> Listed | None:
    """A LIST item's job and view, or None if it has no job label. A resync turns each page into views at once:
    the raw items of a LIST of thousands of pods, held together, were the operator's peak memory."""
    key = job_key(obj)
    if key is None:
        return None
    return key, (PodView.from_pod(obj) if kind == "Pod" else ChildView.from_object(obj, kind))


class ChildCache:
    """Pods and other children by job; every method is O(objects of one job) or one pass over a LIST."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self._pods: dict[Key, dict[str, PodView]] = {}
        self._tombs: dict[Key, dict[str, _Tomb]] = {}
        self._children: dict[Key, dict[tuple[str, str], ChildView]] = {}
        # When a watch event last touched each pod (by uid) and child (by kind and name, deletions too): a count of
        # events, compared with a resync's mark.
        self._pod_seen: dict[Key, dict[str, int]] = {}
        self._child_seen: dict[Key, dict[tuple[str, str], int]] = {}
        self._events = 0
        self._clock = clock
        self._swept = clock()

    def mark(self) -> int:
        """Where the watch events stand now: take it before sending a LIST, and give it to :meth:`resync`."""
        return self._events

    # --- watch events ---

    def apply(self, kind: str, event_type: str | None, obj: Mapping[str, Any]) -> Key | None:
        """One watch event (type None: kopf's initial listing); returns the job it concerns when what the planner
        reads of the object changed (a deletion, a new object, another field of its view), else None: an update
        that changes nothing the planner reads (a status rewritten as it was, a label of someone else's, the
        resourceVersion alone) needs no pass. The cache keeps the newest version either way."""
        key = job_key(obj)
        if key is None:
            return None
        self._events += 1
        if kind == "Pod":
            return key if self._apply_pod(key, event_type, PodView.from_pod(obj)) else None
        view = ChildView.from_object(obj, kind)
        ck = (kind, view.name)
        if event_type == "DELETED":
            # get, not setdefault: a late event of a job already forgotten must not bring its key back.
            _drop(self._children, key, ck)
            if key in self._child_seen:  # a LIST sent before the deletion must not bring it back either
                self._child_seen[key][ck] = self._events
            return key
        group = self._children.setdefault(key, {})
        old, group[ck] = group.get(ck), view
        self._child_seen.setdefault(key, {})[ck] = self._events
        return key if not _same(old, view) else None

    def _apply_pod(self, key: Key, event_type: str | None, view: PodView) -> bool:
        if event_type == "DELETED":
            _drop(self._pods, key, view.uid)
            _drop(self._pod_seen, key, view.uid)
            self._bury(key, view)  # a tombstone, which expires (and keeps a stale LIST from bringing it back)
            return True
        pods = self._pods.setdefault(key, {})
        old, pods[view.uid] = pods.get(view.uid), view
        self._pod_seen.setdefault(key, {})[view.uid] = self._events
        return not _same(old, view)

    def _bury(self, key: Key, view: PodView) -> None:
        now = self._clock()
        self._tombs.setdefault(key, {})[view.uid] = _Tomb(view.as_gone(datetime.now(UTC)), now)
        if now - self._swept > TOMBSTONE_SECONDS:  # pods of deleted jobs are never read again: expire them here
            self._swept = now
            for key_ in list(self._tombs):
                self._expire(key_, now)

    def _expire(self, key: Key, now: float) -> dict[str, _Tomb]:
        tombs = self._tombs.get(key, {})
        for uid in [u for u, t in tombs.items() if t.at < now - TOMBSTONE_SECONDS]:
            del tombs[uid]
        if not tombs:
            self._tombs.pop(key, None)
        return tombs

    # --- resync ---

    def resync(self, kind: str, items: Iterable[Listed], mark: int, scope: Iterable[str] | None = None) -> set[Key]:
        """Replace what a LIST sent after ``mark`` covers (all namespaces, or those in ``scope``) with its items
        (see ``listed``); returns the jobs whose children changed. Objects a watch event touched after the mark
        keep the watch's version."""
        by_job: dict[Key, dict[str, Any]] = {}
        for key, view in items:
            by_job.setdefault(key, {})[view.uid] = view
        namespaces = set(scope) if scope is not None else None
        store: Mapping[Key, Mapping[Any, Any]] = self._pods if kind == "Pod" else self._children
        changed: set[Key] = set()
        for key in set(store) | set(by_job):
            if namespaces is not None and key[0] not in namespaces:
                continue
            if self._resync_job(kind, key, by_job.get(key, {}), mark):
                changed.add(key)
        return changed

    def _resync_job(self, kind: str, key: Key, listed: Mapping[str, Any], mark: int) -> bool:
        if kind == "Pod":
            return self._resync_pods(key, listed, mark)
        return self._resync_children(kind, key, listed, mark)

    def _resync_pods(self, key: Key, listed: Mapping[str, PodView], mark: int) -> bool:
        changed = False
        pods, seen = self._pods.setdefault(key, {}), self._pod_seen.setdefault(key, {})
        for uid, view in list(pods.items()):
            if uid not in listed and seen.get(uid, 0) <= mark:
                del pods[uid]
                seen.pop(uid, None)
                self._bury(key, view)  # deleted while no watch told us
                changed = True
        tombs = self._tombs.get(key, {})
        for uid, view in listed.items():
            if uid in tombs or seen.get(uid, 0) > mark or pods.get(uid) == view:
                continue
            pods[uid] = view
            changed = True
        return changed

    def _resync_children(self, kind: str, key: Key, listed: Mapping[str, ChildView], mark: int) -> bool:
        changed = False
        group, seen = self._children.setdefault(key, {}), self._child_seen.setdefault(key, {})
        fresh = {(kind, v.name): v for v in listed.values()}
        for ck in list(group):
            if ck[0] == kind and ck not in fresh and seen.get(ck, 0) <= mark:
                del group[ck]
                changed = True
        for ck, new in fresh.items():
            if seen.get(ck, 0) > mark or group.get(ck) == new:
                continue
            group[ck] = new
            changed = True
        return changed

    # --- reads ---

    def pods(self, key: Key) -> list[PodView]:
        """The job's pods, then tombstones of pods deleted within TOMBSTONE_SECONDS."""
        tombs = self._expire(key, self._clock())
        live = list(self._pods.get(key, {}).values())
        return live + [t.view for t in tombs.values()]

    def pod(self, key: Key, uid: str) -> PodView | None:
        """The job's live pod with this UID, as the cache holds it (None: not held, or a tombstone)."""
        return self._pods.get(key, {}).get(uid)

    def children(self, key: Key) -> dict[tuple[str, str], ChildView]:
        """The job's non-pod children by (kind, name)."""
        return dict(self._children.get(key, {}))

    def forget(self, key: Key) -> None:
        """The job is gone: drop everything about it."""
        for store in (self._pods, self._tombs, self._children, self._pod_seen, self._child_seen):
            store.pop(key, None)


def _drop(store: dict[Key, dict[Any, Any]], key: Key, item: Any) -> None:
    """Remove ``item`` of the job ``key``, and the job's entry once empty (reads treat a missing one as empty)."""
    group = store.get(key)
    if group is not None:
        group.pop(item, None)
        if not group:
            del store[key]


def _same(old: PodView | ChildView | None, new: PodView | ChildView) -> bool:
    """Whether the planner reads the same of both versions: all fields but the resourceVersion."""
    return old is not None and (old == new or dataclasses.replace(old, resource_version=new.resource_version) == new)

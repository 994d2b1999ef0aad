"""The periodic resync: LIST every kind the operator watches and correct its caches with what the API server
really has. A watch can miss events (an API server restart, a re-list after a 410, a network partition of the
operator); without a resync a pod deleted meanwhile is never replaced. Every job also gets a pass each period,
so anything a level-based pass would fix is fixed within one period at the latest. The period stretches with the
number of objects listed (next_wait), so the resync's cost stays bounded however many jobs run."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, NamedTuple, Protocol, TypeVar

from ddpjob_operator.api.names import LABEL_JOB_NAME
from ddpjob_operator.api.spec import API_VERSION, KIND
from ddpjob_operator.kube.client import API_VERSIONS, OPTIONAL_KINDS, Kube
from ddpjob_operator.kube.kopf_compat import kopf_errors
from ddpjob_operator.metrics import registry as metrics
from ddpjob_operator.runtime.cache import ChildCache, Key, Listed, job_key, listed
from ddpjob_operator.runtime.status_write import older

log = logging.getLogger("ddpjob.resync")

#: Default seconds between two resyncs (`ddpjob operator --resync-seconds`).
DEFAULT_RESYNC_SECONDS = 60.0
#: Seconds a periodic resync waits for the watch to deliver pods the cache does not hold as listed, before it lists
#: their jobs' full pods.
STALE_GRACE_SECONDS = 2.0
#: The status of a LIST continued past the API server's compaction.
EXPIRED = 410
T = TypeVar("T")
#: Objects a resync may list per second of the time between two resyncs: past ``period x LISTED_PER_SECOND``
#: objects the period stretches (next_wait). A listed object costs the operator ~150 us (its JSON, its view, the
#: comparison; a resync was half of the operator's 0.060 cores at 1,000 running jobs x 8 workers, ~12,000 objects a
#: minute), so the resync takes ~0.03 cores at any scale: at 5,000 jobs x 8 (~60,000 objects) every 5 min, not every
#: minute. 60 s, the default period, holds up to ~1,000 such jobs.
LISTED_PER_SECOND = 200.0
#: More jobs than this with pods the cache does not hold as listed: one full LIST of pods instead of one per job.
FULL_LIST_OVER = 20


_skipped: set[str] = set()


def _skip_once(kind: str, err: Exception) -> None:
    """An optional kind whose CRD is not installed (or not granted): nothing of it to list; said once."""
    if kind not in _skipped:
        _skipped.add(kind)
        log.info("not listing %s (%s): its CRD is not installed or not granted; jobs that need it say so", kind, err)


class JobSink(Protocol):
    """What the resync feeds: the controller."""

    def mark(self) -> int: ...

    def job_seen(self, event_type: str | None, body: Mapping[str, Any], listed_after: int | None = None) -> None: ...

    def forget_unlisted(self, listed: set[Key], mark: int, scope: Iterable[str] | None) -> None: ...

    def enqueue(self, keys: Iterable[Key]) -> None: ...

    def resynced(self) -> None: ...


class Resynced(NamedTuple):
    """What one resync did: the jobs whose children the watches had missed changes of, the objects it listed."""

    changed: int
    listed: int


def next_wait(period: float, listed: int) -> float:
    """Seconds from a resync that listed ``listed`` objects to the next: ``period``, or longer when that many objects
    a period would cost more than LISTED_PER_SECOND."""
    return max(period, listed / LISTED_PER_SECOND)


async def _list_children(kube: Kube, kind: str, ns: str | None, label_selector: str = LABEL_JOB_NAME
                         ) -> list[Listed]:
    """Every child of ``kind`` in ``ns`` (all namespaces: None) as a view; raw items are dropped page by page."""
    views: list[Listed] = []
    async for page in kube.pages(API_VERSIONS[kind], kind, ns, label_selector):
        views += [v for v in (listed(kind, obj) for obj in page) if v is not None]
    return views


def _caught_up(held: str, listed: str) -> bool:
    """Whether the cache's pod at resourceVersion ``held`` is the listed one or newer (status_write.older: versions
    are ordered only when both are integers, as an etcd-backed API server's are)."""
    return held == listed or older(listed, held)


def _stale_jobs(cache: ChildCache, listed: dict[Key, list[tuple[str, str]]], views: dict[str, Listed]) -> set[Key]:
    """The jobs with a listed pod (uid, resourceVersion) the cache does not hold at that version or a newer one; the
    others' pods go into ``views`` as the cache holds them."""
    stale: set[Key] = set()
    for key, pods in listed.items():
        held = [cache.pod(key, uid) for uid, _ in pods]
        if all(h is not None and _caught_up(h.resource_version, rv) for h, (_, rv) in zip(held, pods, strict=True)):
            views.update((h.uid, (key, h)) for h in held if h is not None)
        else:
            stale.add(key)
    return stale


async def _list_pods(kube: Kube, cache: ChildCache, ns: str | None, grace: float = 0.0) -> list[Listed]:
    """Every pod of a job as a view, in two steps: a metadata-only LIST (about half of a kwok pod's bytes, managedFields
    most of them), then the full pods of only those jobs that have a pod the cache does not hold at the listed
    resourceVersion (new, changed, or missed) ``grace`` seconds after the LIST: while jobs start, the pods change faster
    than a resync lists them, and the watch, a moment behind, delivers what the LIST showed (500 jobs starting: a full
    LIST of every pod, 4 % of the operator's CPU). Decoding full LISTs of every pod was 62 % of an idle operator's CPU
    at 1,000 running jobs (docs/operator-scale.md, "The steady state"); a watch rarely misses anything, so the second
    step is rarely taken. Many such jobs (after a watch outage): one full LIST instead."""
    views: dict[str, Listed] = {}
    listed: dict[Key, list[tuple[str, str]]] = {}
    async for page in kube.pages("v1", "Pod", ns, LABEL_JOB_NAME, metadata_only=True):
        for obj in page:
            key, meta = job_key(obj), obj.get("metadata") or {}
            if key is not None:
                listed.setdefault(key, []).append((str(meta.get("uid") or ""), str(meta.get("resourceVersion") or "")))
    stale = _stale_jobs(cache, listed, views)
    if stale and grace > 0:
        await asyncio.sleep(grace)
        stale = _stale_jobs(cache, {key: listed[key] for key in stale}, views)
    if len(stale) > FULL_LIST_OVER:
        return await _list_children(kube, "Pod", ns)
    for job in stale:
        for item in await _list_children(kube, "Pod", job[0], f"{LABEL_JOB_NAME}={job[1]}"):
            views[item[1].uid] = item
    return list(views.values())


async def resync_once(kube: Kube, cache: ChildCache, sink: JobSink, namespaces: list[str], grace: float = 0.0
                      ) -> Resynced:
    """One full resync: the number of jobs whose children changed, and of objects listed. ``grace``: seconds the watch
    gets to deliver pods that changed while they were listed (_list_pods; none in the initial sync, where the cache is
    empty). With watched namespaces, each one's LIST corrects only that namespace, from the mark taken right before it
    (cache.py: an object a watch delivered after the mark is newer than the LIST): one cut-off for all namespaces took
    an object created in one namespace after its LIST, but before another namespace's, for deleted."""
    scopes: list[str | None] = list(namespaces) if namespaces else [None]
    changed: set[Key] = set()
    listed = 0
    for kind in API_VERSIONS:
        for ns in scopes:
            try:
                jobs, n = await _again_if_expired(functools.partial(_resync_kind, kube, cache, kind, ns, grace))
                changed, listed = changed | jobs, listed + n
            except (kopf_errors.APINotFoundError, kopf_errors.APIForbiddenError) as err:
                if kind not in OPTIONAL_KINDS:
                    raise
                _skip_once(kind, err)
                break
    for ns in scopes:
        listed += await _again_if_expired(functools.partial(_resync_jobs, kube, sink, ns))
    sink.resynced()
    sink.enqueue(changed)
    return Resynced(len(changed), listed)


async def _again_if_expired(step: Callable[[], Awaitable[T]]) -> T:
    """``step`` (a LIST and what follows from it), once more from the start if its LIST was continued past the API
    server's compaction (410: "The provided continue parameter is too old"; its pages must come from one snapshot).
    45,000 pods listed while they started outlived it here; the resync then waited a whole period."""
    try:
        return await step()
    except kopf_errors.APIClientError as err:
        if err.status != EXPIRED:
            raise
        log.info("resync: a LIST outlived the API server's compaction (410); listing it again")
        return await step()


async def _resync_kind(kube: Kube, cache: ChildCache, kind: str, ns: str | None, grace: float
                       ) -> tuple[set[Key], int]:
    """Correct the cache's ``kind`` in ``ns`` with a LIST; the jobs whose children changed, the objects listed."""
    mark = cache.mark()
    views = await (_list_pods(kube, cache, ns, grace) if kind == "Pod" else _list_children(kube, kind, ns))
    return cache.resync(kind, views, mark, None if ns is None else [ns]), len(views)


async def _resync_jobs(kube: Kube, sink: JobSink, ns: str | None) -> int:
    """Learn missed jobs and pass every job of ``ns``, one page of bodies at a time; forget those not listed. The
    number of jobs listed."""
    jobs: set[Key] = set()
    mark = sink.mark()
    async for page in kube.pages(API_VERSION, KIND, ns, ""):
        for body in page:
            meta = body.get("metadata") or {}
            jobs.add((str(meta.get("namespace") or ""), str(meta.get("name") or "")))
            sink.job_seen("RESYNC", body, listed_after=mark)
    sink.forget_unlisted(jobs, mark, None if ns is None else [ns])
    return len(jobs)


async def sync_then_resync(kube: Kube, cache: ChildCache, sink: JobSink, namespaces: list[str], period: float,
                           synced: asyncio.Event) -> None:
    """The initial full LIST (retried until it succeeds), then ``synced`` is set, then a resync every ``period`` seconds
    or longer (next_wait; none when 0). No pass may run before ``synced``: a pass over a half-filled cache would see
    children missing that exist (spurious ChildRecreated Events) and could not tell a pod lost while the operator was
    down from one not listed yet."""
    attempt = 0
    while not synced.is_set():
        try:
            await resync_once(kube, cache, sink, namespaces)
            synced.set()
            log.info("initial sync done: every watched kind listed")
        except asyncio.CancelledError:
            raise
        except Exception as err:
            attempt += 1
            wait = min(30.0, 0.5 * 2**attempt)
            log.warning("initial sync failed, retrying in %.0fs: %r", wait, err)
            await asyncio.sleep(wait)
    if period > 0:
        await resync_forever(kube, cache, sink, namespaces, period)


async def resync_forever(kube: Kube, cache: ChildCache, sink: JobSink, namespaces: list[str],
                         period: float) -> None:
    """Resync every ``period`` seconds (or longer: next_wait) until cancelled; an error is logged and the next
    period tries again."""
    wait = period
    while True:
        await asyncio.sleep(wait)
        started = time.monotonic()
        try:
            done = await resync_once(kube, cache, sink, namespaces, STALE_GRACE_SECONDS)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # the next period retries; a resync must never take the operator down
            log.warning("resync failed, retrying in %.0fs: %r", wait, err)
            continue
        metrics.RESYNC_SECONDS.observe(time.monotonic() - started)
        metrics.RESYNC_LISTED.set(done.listed)
        if done.changed:
            log.info("resync: the watches had missed changes of %d job(s); corrected", done.changed)
        wait = _paced(period, done.listed, wait)


def _paced(period: float, listed: int, last: float) -> float:
    """next_wait, said when the period starts or stops stretching."""
    wait = next_wait(period, listed)
    if (wait > period) != (last > period):
        log.info("resync: %d objects listed; the next in %.0f s (a resync lists at most %.0f objects a second of the "
                 "time between two)", listed, wait, LISTED_PER_SECOND)
    return wait

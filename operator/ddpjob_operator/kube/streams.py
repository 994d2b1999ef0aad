"""Pods and DDPJobs reach the controller straight from kopf's watch stream, not through kopf's per-object handler
machinery.

kopf's stream (its private ``infinite_watch``, reached through kopf_compat.py like the API client client.py uses)
does the list, the watch from its resourceVersion, the re-list after a 410 and the reconnects, with the server-side
label selector handlers.configure sets for pods. What it skips is the rest of kopf's path per event: a worker task
and queue per object, cause detection, a memory kept per object, and a handler call with its kwargs and logger.
Pods are nearly all of the operator's watch events while jobs start (a burst of 500 jobs x 5 pods is ~12,000): with
this stream the operator's CPU over bench/operator_scale.py's 500-job case fell from 27.4-27.6 s to 18.2-18.7 s.
DDPJobs are nearly all of them once jobs run (each running job's rank 0 reports its progress): kopf's machinery for
those events was ~25 % of the operator's CPU at 1,000 running jobs (docs/operator-scale.md, "The steady state").
The other kinds, rare, still go through kopf handlers (handlers.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import kopf

from ddpjob_operator.api.spec import GROUP, KIND, PLURAL, VERSION
from ddpjob_operator.kube.kopf_compat import kopf_references as references
from ddpjob_operator.kube.kopf_compat import kopf_watching as watching

log = logging.getLogger("ddpjob.streams")

_VERBS = frozenset({"list", "watch"})
PODS = references.Resource(group="", version="v1", plural="pods", kind="Pod", singular="pod", namespaced=True,
                           verbs=_VERBS)
DDPJOBS = references.Resource(group=GROUP, version=VERSION, plural=PLURAL, kind=KIND, singular=KIND.lower(),
                              namespaced=True, verbs=_VERBS)
#: Longest wait before a failed stream is started again.
MAX_RETRY_SECONDS = 30.0

Sink = Callable[[str | None, Mapping[str, Any]], None]


async def watch(settings: kopf.OperatorSettings, resource: references.Resource, namespaces: Iterable[str],
                sink: Sink) -> None:
    """Feed ``sink(event_type, object)`` from one stream of ``resource`` per namespace (one cluster-wide stream
    without any) until cancelled. ``event_type`` is None for the objects of a (re-)listing, as kopf's handlers got
    it."""
    scopes: list[str | None] = [*namespaces] or [None]
    await asyncio.gather(*(_stream(settings, resource, ns, sink) for ns in scopes))


def _feed(sink: Sink, resource: references.Resource, event: Mapping[str, Any]) -> None:
    """One event into the sink. A sink's error is logged and the stream goes on, as kopf's handlers did: a
    restarted stream would re-list everything and meet the same object again."""
    try:
        sink(event.get("type"), event["object"])
    except Exception:
        meta = (event.get("object") or {}).get("metadata") or {}
        log.exception("%s %s/%s: its %s event was not taken in", resource.kind, meta.get("namespace"),
                      meta.get("name"), event.get("type") or "listed")


async def _stream(settings: kopf.OperatorSettings, resource: references.Resource, namespace: str | None,
                  sink: Sink) -> None:
    failures = 0
    while True:
        try:
            scope = None if namespace is None else references.NamespaceName(namespace)
            async for event in watching.infinite_watch(settings=settings, resource=resource, namespace=scope):
                failures = 0
                if isinstance(event, dict) and event.get("type") != "BOOKMARK":  # not kopf's Bookmark.LISTED
                    _feed(sink, resource, event)
            await asyncio.sleep(1.0)  # it never ends by design; if it does, not in a tight loop
        except asyncio.CancelledError:
            raise
        except Exception as err:  # the periodic resync covers the gap; the stream must come back
            failures += 1
            wait = min(MAX_RETRY_SECONDS, 0.5 * 2**failures)
            log.warning("%s watch %s failed, starting it again in %.0fs: %r", resource.plural,
                        f"in {namespace}" if namespace else "cluster-wide", wait, err)
            await asyncio.sleep(wait)

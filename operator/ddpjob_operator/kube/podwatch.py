"""Pods reach the cache straight from kopf's watch stream, not through kopf's per-object handler machinery.

kopf's stream (its private ``infinite_watch``, reached through kopf_compat.py like the API client client.py uses)
does the list, the watch from its resourceVersion, the re-list after a 410 and the reconnects, with the server-side
label selector handlers.configure sets for pods. What it skips is the rest of kopf's path per event: a
worker task and queue per pod, cause detection, a memory kept per pod, and a handler call with its kwargs and
logger. Pods are nearly all of the operator's watch events (a burst of 500 jobs x 5 pods is ~12,000): with this
stream the operator's CPU over bench/operator_scale.py's 500-job case fell from 27.4-27.6 s to 18.2-18.7 s, on a
machine where the operator and the API server share 2 cores. Every other kind still goes through kopf handlers
(handlers.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import kopf

from ddpjob_operator.kube.kopf_compat import kopf_references as references
from ddpjob_operator.kube.kopf_compat import kopf_watching as watching

log = logging.getLogger("ddpjob.podwatch")

PODS = references.Resource(group="", version="v1", plural="pods", kind="Pod", singular="pod", namespaced=True,
                           verbs=frozenset({"list", "watch"}))
#: Longest wait before a failed stream is started again.
MAX_RETRY_SECONDS = 30.0

Sink = Callable[[str | None, Mapping[str, Any]], None]


async def watch_pods(settings: kopf.OperatorSettings, namespaces: Iterable[str], sink: Sink) -> None:
    """Feed ``sink(event_type, pod)`` from one stream per namespace (one cluster-wide stream without any) until
    cancelled. ``event_type`` is None for the objects of a (re-)listing, as kopf's handlers got it."""
    scopes: list[str | None] = [*namespaces] or [None]
    await asyncio.gather(*(_stream(settings, ns, sink) for ns in scopes))


async def _stream(settings: kopf.OperatorSettings, namespace: str | None, sink: Sink) -> None:
    failures = 0
    while True:
        try:
            scope = None if namespace is None else references.NamespaceName(namespace)
            async for event in watching.infinite_watch(settings=settings, resource=PODS, namespace=scope):
                failures = 0
                if isinstance(event, dict) and event.get("type") != "BOOKMARK":  # not kopf's Bookmark.LISTED
                    sink(event.get("type"), event["object"])
            await asyncio.sleep(1.0)  # it never ends by design; if it does, not in a tight loop
        except asyncio.CancelledError:
            raise
        except Exception as err:  # the periodic resync covers the gap; the stream must come back
            failures += 1
            wait = min(MAX_RETRY_SECONDS, 0.5 * 2**failures)
            log.warning("pod watch %s failed, starting it again in %.0fs: %r",
                        f"in {namespace}" if namespace else "cluster-wide", wait, err)
            await asyncio.sleep(wait)

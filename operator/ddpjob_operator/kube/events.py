"""The passes' Events, posted in the background: in order for each object, at most ``limit`` posts at once.

kopf's own poster (behind ``kopf.info``/``kopf.warn``) takes its queue from a context that kopf sets only inside
its per-object handlers; the controller's DDPJobs come from its own stream (streams.py), outside any. This posts
with kopf's ``post_event`` (kopf_compat.py: the same body, the same message cut, the leader fence of
``fence_events``), as kopf's poster did."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Hashable, Mapping
from typing import Any, cast

import kopf

from ddpjob_operator.kube import kopf_compat
from ddpjob_operator.kube.kopf_compat import kopf_references as references

log = logging.getLogger("ddpjob.events")

EVENTS = references.Resource(group="", version="v1", plural="events", kind="Event", singular="event",
                             namespaced=True, verbs=frozenset({"create"}))
#: Events posted at once (each post holds a connection, see client.MAX_IN_FLIGHT): a burst of jobs turning
#: Running would otherwise open a connection per job.
POSTERS = 16

_Event = tuple[kopf.ObjectReference, str, str, str]  # object reference, type, reason, message


class Poster:
    """Posts Events for objects: ``post`` returns at once; one drain task per object with Events waiting."""

    def __init__(self, settings: kopf.OperatorSettings, limit: int = POSTERS) -> None:
        self._settings = settings
        self._slots = asyncio.Semaphore(limit)
        self._waiting: dict[Hashable, collections.deque[_Event]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def post(self, body: Mapping[str, Any], type: str, reason: str, message: str) -> None:
        """Queue an Event of ``type`` (Normal, Warning) about the object ``body``."""
        ref = kopf.build_object_reference(cast(kopf.Body, body))  # reads only metadata, apiVersion, kind
        key = ref.get("uid") or (ref.get("namespace"), ref.get("name"))
        waiting = self._waiting.get(key)
        if waiting is not None:  # its drain task is running: after the ones before it
            waiting.append((ref, type, reason, message))
            return
        self._waiting[key] = collections.deque([(ref, type, reason, message)])
        task = asyncio.create_task(self._drain(key), name=f"ddpjob-events-{ref.get('name')}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drain(self, key: Hashable) -> None:
        waiting = self._waiting[key]
        try:
            while waiting:
                ref, type, reason, message = waiting[0]
                async with self._slots:
                    try:  # by attribute: fence_events may have replaced it
                        await kopf_compat.kopf_events.post_event(
                            ref=ref, type=type, reason=reason, message=message, resource=EVENTS,
                            settings=self._settings, logger=log)
                    except Exception as err:  # an Event is auxiliary: said in the log, the next one goes on
                        log.warning("Event %s of %s/%s not posted: %r", reason, ref.get("namespace"),
                                    ref.get("name"), err)
                waiting.popleft()
        finally:
            del self._waiting[key]

    async def close(self) -> None:
        """Cancel what is still waiting (the operator stops)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

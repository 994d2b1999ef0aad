"""kopf's private modules, named here and nowhere else: the operator reuses kopf's authenticated API client and its
error types (kube/client.py, runtime/resync.py), its watch stream (streams.py) and its Event post (events.py),
which kopf keeps under ``kopf._cogs`` and may change in any release; and it fences every Event post
(:func:`fence_events`). pyproject
pins kopf to the minor these were read in and tested with (``kopf>=1.45,<1.46``); moving that pin means checking
each name below against the new kopf, and the tests that use them."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kopf._cogs.clients import api as kopf_api
from kopf._cogs.clients import errors as kopf_errors
from kopf._cogs.clients import events as kopf_events
from kopf._cogs.clients import watching as kopf_watching
from kopf._cogs.structs import references as kopf_references

__all__ = ["fence_events", "kopf_api", "kopf_errors", "kopf_events", "kopf_references", "kopf_watching"]

log = logging.getLogger("ddpjob.kube")

_may_post: Callable[[], bool] = lambda: True  # noqa: E731


def fence_events(may_write: Callable[[], bool]) -> None:
    """Post Events (the controller's, through events.Poster, and kopf's own log lines at the posting level) only
    while ``may_write()``. Both posters send them after they were made and past kube/client.py's fence: it is asked
    as each Event goes out (kopf._core.engines.posting and events.Poster call ``events.post_event`` through the
    module). Without kopf's retries: a retry came seconds later, when another
    replica may lead; an Event lost to a transient error is the lesser harm."""
    global _may_post
    _may_post = may_write
    inner = kopf_events.post_event
    if getattr(inner, "_ddpjob_fenced", False):
        return

    async def fenced(**kwargs: Any) -> None:
        if not _may_post():
            log.warning("Event %s not posted: this replica does not hold the leader Lease", kwargs.get("reason"))
            return
        await inner(**{**kwargs, "backoffs": ()})

    fenced._ddpjob_fenced = True  # type: ignore[attr-defined]
    setattr(kopf_events, "post_event", fenced)  # noqa: B010 - kopf's private module, by name

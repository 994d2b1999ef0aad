"""kopf wiring only: the operator's settings, the controller's start and stop, and handlers for the rare kinds
(Services, PVCs, NetworkPolicies, PodGroups, Workloads, server-side filtered by the job-name label, and the
namespaces' worker identity) that feed the controller's cache and turn every event into "reconcile this job" on its
queue. DDPJobs and pods, nearly all of the events, reach the controller through its own streams (kube/streams.py).
Handlers return None (kopf would store a return value in the status)."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from ddpjob_operator.api import names
from ddpjob_operator.kube import events
from ddpjob_operator.kube.client import API_VERSIONS, LIST_PAGE, Kube, watch_resource
from ddpjob_operator.kube.identity import IDENTITY_RESOURCES
from ddpjob_operator.runtime.controller import Controller

controller = Controller()

#: Conservative client settings that keep 500 jobs x 4 pods fast without hammering the API server.
WATCH_SERVER_TIMEOUT = 300
REQUEST_TIMEOUT = 30
#: Seconds an idle kopf per-object worker lingers (holding the object's last body) before it exits.
IDLE_WORKER_SECONDS = 0.5
#: Events that kopf posts at once (its own, of handler errors; the controller's go through kube/events.py).
EVENT_POSTERS = events.POSTERS


class EventHandlersOnly(kopf.AnnotationsDiffBaseStorage):
    """kopf's diff base, never built. On every watch event kopf builds a deep copy of the whole object (status
    included) and diffs it with the last one, for on.create/on.update/on.field handlers and daemons; this
    operator registers only event handlers, which kopf never diffs. A change-detecting handler added here would
    never fire: tests/unit/operator/test_handlers.py forbids one."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Operator settings: standalone (no peering), events posted, pods watched server-side by label."""
    settings.peering.standalone = True
    settings.posting.enabled = True
    settings.posting.level = logging.INFO
    settings.posting.reporting_component = "ddpjob-operator"
    settings.watching.server_timeout = WATCH_SERVER_TIMEOUT
    settings.watching.client_timeout = WATCH_SERVER_TIMEOUT + 30
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = REQUEST_TIMEOUT
    settings.networking.connect_timeout = 10
    # Only our children travel over the watches: the API server filters them, not the operator.
    for kind in API_VERSIONS:
        settings.watching.label_selectors[watch_resource(kind)] = names.LABEL_JOB_NAME
    for resource in IDENTITY_RESOURCES:
        settings.watching.label_selectors[resource] = "=".join(names.IDENTITY_LABEL)
    settings.persistence.diffbase_storage = EventHandlersOnly()
    # kopf re-lists a kind whenever its watch restarts; unchunked, every pod of every job arrived in one response
    # and was held whole (38 MB in a tracemalloc snapshot at 500 jobs x 4 workers).
    settings.watching.chunk_size = LIST_PAGE
    # kopf's per-object worker keeps the object's last raw body until it idles out (default 5 s): after a burst,
    # one full pod per pod that changed. Handlers here are instant (they only feed the cache).
    settings.queueing.idle_timeout = IDLE_WORKER_SECONDS
    # kopf posts Events with one worker per object and no limit: a burst of jobs turning Running would open a
    # connection per job.
    settings.posting.worker_limit = EVENT_POSTERS


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In-cluster service account first, else the kubeconfig (KUBECONFIG or ~/.kube/config)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Start the controller (after configure: kopf runs startup handlers in order): its workers, the resync and
    the streams of DDPJobs and pods (kube/streams.py) and its Event poster (kube/events.py). Inside kopf's context,
    so that the API calls find kopf's credentials; under leader election kopf starts only once the Lease is held."""
    controller.start(Kube(settings, logging.getLogger("ddpjob.kube")))


def _watch(kind: str, resource: str) -> None:
    async def child_event(type: str | None, event: kopf.RawEvent, **_: Any) -> None:
        controller.child_seen(kind, type, event["object"])

    child_event.__name__ = child_event.__qualname__ = f"{kind.lower()}_event"
    kopf.on.event(resource, labels={names.LABEL_JOB_NAME: kopf.PRESENT})(child_event)


# The same kinds the resync lists (kube.API_VERSIONS), so the two can never cover different children. Pods come
# from the controller's own stream instead (kube/streams.py), with the label selector configure() sets for them.
for _kind in API_VERSIONS:
    if _kind != "Pod":
        _watch(_kind, watch_resource(_kind))


async def identity_event(type: str | None, event: kopf.RawEvent, **_: Any) -> None:
    """The namespace's worker ServiceAccount, Role or RoleBinding was deleted: its jobs' next passes create it
    again (within a second, like a job's own children)."""
    if type == "DELETED":
        controller.identity_lost(str((event["object"].get("metadata") or {}).get("namespace") or ""))


for _resource in IDENTITY_RESOURCES:
    kopf.on.event(_resource, labels=dict([names.IDENTITY_LABEL]))(identity_event)


@kopf.on.cleanup()
async def shutdown(**_: Any) -> None:
    """Stop the workers before kopf closes its API session."""
    await controller.stop()

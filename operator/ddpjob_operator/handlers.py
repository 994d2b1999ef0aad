"""kopf wiring only: watch DDPJobs and every kind of child (pods, Services, ServiceAccounts, Roles, RoleBindings,
PVCs, NetworkPolicies, server-side filtered by the job-name label), feed the controller's cache, and turn every
event into "reconcile this job" on its queue. Handlers return None (kopf would store a return value in the
status)."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from ddpjob_operator import names
from ddpjob_operator.controller import Controller
from ddpjob_operator.kube import API_VERSIONS, Kube, watch_resource
from ddpjob_operator.spec import GROUP, PLURAL, VERSION, InvalidSpec, parse_ddpjob

controller = Controller()
_settings: list[kopf.OperatorSettings] = []

#: Conservative client settings that keep 500 jobs x 4 pods fast without hammering the API server.
WATCH_SERVER_TIMEOUT = 300
REQUEST_TIMEOUT = 30


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
    _settings.append(settings)  # resource handlers get no `settings` kwarg; the API layer needs them


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In-cluster service account first, else the kubeconfig (KUBECONFIG or ~/.kube/config)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def ddpjob_event(
    type: str,
    body: kopf.Body,
    logger: kopf.Logger,
    **kwargs: Any,
) -> None:
    """Any change of a DDPJob (or the initial listing): schedule a reconcile pass."""
    controller.start(Kube(_settings[-1], logging.getLogger("ddpjob.kube")))
    controller.job_seen(type, dict(body))
    if type != "DELETED":
        try:
            parse_ddpjob(body)
        except InvalidSpec as err:
            # The pass writes Failed/InvalidSpec; PermanentError tells kopf not to retry this handler.
            raise kopf.PermanentError(f"invalid spec: {err}") from None
    logger.debug("event %s", type)


def _watch(kind: str, resource: str) -> None:
    async def child_event(type: str | None, body: kopf.Body, **_: Any) -> None:
        controller.child_seen(kind, type, body)

    child_event.__name__ = child_event.__qualname__ = f"{kind.lower()}_event"
    kopf.on.event(resource, labels={names.LABEL_JOB_NAME: kopf.PRESENT})(child_event)


# The same kinds the resync lists (kube.API_VERSIONS), so the two can never cover different children.
for _kind in API_VERSIONS:
    _watch(_kind, watch_resource(_kind))


@kopf.on.cleanup()
async def shutdown(**_: Any) -> None:
    """Stop the workers before kopf closes its API session."""
    await controller.stop()

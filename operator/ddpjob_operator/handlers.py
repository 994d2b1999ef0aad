"""kopf wiring only: watch DDPJobs and their pods, keep a pod index, and turn every event into "reconcile this
job" on the controller's queue. Handlers return None (kopf would store a return value in the status)."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from ddpjob_operator import names
from ddpjob_operator.controller import Controller, Key
from ddpjob_operator.kube import Kube
from ddpjob_operator.observed import PodView
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
    # Only our pods travel over the watch: the API server filters them, not the operator.
    settings.watching.label_selectors["pods"] = names.LABEL_JOB_NAME
    _settings.append(settings)  # resource handlers get no `settings` kwarg; the API layer needs them


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In-cluster service account first, else the kubeconfig (KUBECONFIG or ~/.kube/config)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.index("pods", labels={names.LABEL_JOB_NAME: kopf.PRESENT})
def pods_by_job(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Key, PodView]:
    """Every pod of every DDPJob, as a small view keyed by (namespace, job name)."""
    return {(namespace or "", labels[names.LABEL_JOB_NAME]): PodView.from_pod(body)}


@kopf.on.event(GROUP, VERSION, PLURAL)
async def ddpjob_event(
    type: str,
    body: kopf.Body,
    logger: kopf.Logger,
    **kwargs: Any,
) -> None:
    """Any change of a DDPJob (or the initial listing): schedule a reconcile pass."""
    index: kopf.Index[Key, PodView] = kwargs["pods_by_job"]  # kopf injects indices by name
    controller.start(Kube(_settings[-1], logging.getLogger("ddpjob.kube")), index)
    controller.job_seen(type, dict(body))
    if type != "DELETED":
        try:
            parse_ddpjob(body)
        except InvalidSpec as err:
            # The pass writes Failed/InvalidSpec; PermanentError tells kopf not to retry this handler.
            raise kopf.PermanentError(f"invalid spec: {err}") from None
    logger.debug("event %s", type)


@kopf.on.event("pods", labels={names.LABEL_JOB_NAME: kopf.PRESENT})
async def pod_event(namespace: str | None, labels: kopf.Labels, **_: Any) -> None:
    """Any change of one of our pods: schedule a pass of its job."""
    controller.pod_seen((namespace or "", labels[names.LABEL_JOB_NAME]))


@kopf.on.cleanup()
async def shutdown(**_: Any) -> None:
    """Stop the workers before kopf closes its API session."""
    await controller.stop()

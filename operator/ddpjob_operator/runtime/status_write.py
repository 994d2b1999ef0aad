"""The pass's one status write, conditional on the body the pass planned from (kube.Kube.patch_status).

When another write came first (a worker's progress report, an edit of the job, another operator replica after this
one lost the Lease), the API server refuses it with 409. The pass then does not retry its plan, which was made
from what it can no longer see: it reads the job again, and the next pass plans from that. Nothing of the refused
plan is said (Events) or counted (the controller's floors), so a loss it counted is counted once, by the plan that
is written."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from ddpjob_operator.api.spec import API_VERSION, KIND
from ddpjob_operator.kube.client import Kube, StatusConflict

log = logging.getLogger("ddpjob.controller")

Obj = dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Written:
    """What the write came to: the job as it is now ({} when it is gone) and whether the write was refused."""

    body: Obj
    conflict: bool = False


async def write(kube: Kube, key: tuple[str, str], planned_from: str, patch: Mapping[str, Any]) -> Written:
    """Write ``patch`` if the job is still at resourceVersion ``planned_from``; otherwise read it again."""
    try:
        return Written(await kube.patch_status(key[0], key[1], patch, planned_from))
    except StatusConflict:
        log.warning("job=%s/%s status not written: the job changed since this pass read it (resourceVersion %s; "
                    "another writer came first: a worker's progress, an edit, or another operator replica): "
                    "reading it again to plan anew", *key, planned_from)
        return Written(await kube.get(API_VERSION, KIND, key[0], key[1]) or {}, conflict=True)

"""The pass's one status write, conditional on the body the pass planned from (kube.Kube.patch_status).

When another write came first (a worker's progress report, an edit of the job, kopf's own bookkeeping, another
operator replica after this one lost the Lease), the API server refuses it with 409. The pass has already acted
(a lost pod replaced, say), so dropping its plan would lose what it saw: the next pass finds the replacement and
counts no loss. So the pass plans again from the job as it is now, with what it observed and did, and writes that,
conditional on the new resourceVersion; the next pass carries out whatever the newer body changed. A stale leader
never gets this far: leadership is asked right before each write (kube.leader). After MAX_TRIES refusals in a row
it gives up, reads the job again and leaves it to the next pass; nothing of the refused plans is then said (Events)
or counted (the controller's floors)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from ddpjob_operator.api.spec import API_VERSION, KIND
from ddpjob_operator.kube.client import Kube, StatusConflict
from ddpjob_operator.planner.plan import Plan

log = logging.getLogger("ddpjob.controller")

Obj = dict[str, Any]

#: Writes one pass tries (the first plan's and re-plans'): each refusal means another writer wrote in between.
MAX_TRIES = 3


@dataclasses.dataclass(frozen=True, slots=True)
class Written:
    """What the write came to: the job as it is now ({} when it is gone), the plan whose patch was written (a re-plan
    after a refusal), whether it was re-planned, and whether every try was refused."""

    body: Obj
    plan: Plan
    replanned: bool = False
    conflict: bool = False


def resource_version(body: Mapping[str, Any]) -> str:
    """The body's resourceVersion, as the API server wrote it."""
    return str((body.get("metadata") or {}).get("resourceVersion") or "")


def older(rv: str, than: str) -> bool:
    """Whether an object at resourceVersion ``rv`` is older than one at ``than``. resourceVersions are opaque (API
    conventions); an etcd-backed API server's are integers that grow, and only then can a late watch event be told
    from a newer one. Waiting for the watch to echo our own write is no rule instead: kopf skips events that a newer
    one follows closely. Any other API server gets arrival order: the newest object to arrive is the newest."""
    return rv.isdigit() and than.isdigit() and int(rv) < int(than)


async def write(kube: Kube, key: tuple[str, str], planned_from: str, plan: Plan,
                replan: Callable[[Obj], Plan]) -> Written:
    """Write ``plan``'s patch if the job is still at resourceVersion ``planned_from``; on a refusal plan again
    from the job as it is now (``replan``) and write that, up to MAX_TRIES writes."""
    for attempt in range(1, MAX_TRIES + 1):
        try:
            return Written(await kube.patch_status(key[0], key[1], plan.patch, planned_from), plan,
                           replanned=attempt > 1)
        except StatusConflict:
            fresh = await kube.get(API_VERSION, KIND, key[0], key[1]) or {}
        if not fresh or attempt == MAX_TRIES:
            log.warning("job=%s/%s status not written: the job changed under each of %d writes (resourceVersion %s): "
                        "reading it again to plan anew", *key, attempt, planned_from)
            return Written(fresh, plan, conflict=True)
        log.info("job=%s/%s status write refused: the job changed since this pass read it (resourceVersion %s, now "
                 "%s; a worker's progress, an edit, or another writer): planning again from it with what this pass "
                 "saw and did", *key, planned_from, resource_version(fresh))
        plan, planned_from = replan(fresh), resource_version(fresh)
        if not plan.patch:
            return Written(fresh, plan, replanned=True)
    raise AssertionError("unreachable")  # the loop returns on its last try

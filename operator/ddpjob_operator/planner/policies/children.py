"""Children: every pass makes sure each non-pod child exists and is this job's, by controller ownerReference UID.

A missing child (deleted by hand, lost with a namespace's objects, never created because the operator crashed) is
created again; an object with the child's name that this job does not control is a conflict: it is reported
(condition ChildConflict, naming it) and never adopted, and no pod is created while it lasts, because a foreign
Service or Role would silently route or authorize the job's pods. The one exception is a checkpoint PVC the job
created with ``retainOnDelete: true``: it has no ownerReference by design (so it outlives the job) and carries
the job's name label, so a DDPJob created again with the same name resumes from it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ddpjob_operator.planner.observation import ChildView

Obj = dict[str, Any]
ChildKey = tuple[str, str]
"""(kind, name)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Problem:
    """What the API server said when the operator last tried to create a child (kept by the controller)."""

    kind: str
    name: str
    conflict: bool
    """True: the name is taken by an object this job does not control. False: the create was refused."""
    reason: str
    """Forbidden, QuotaExceeded, QuotaNeedsResources, PodSecurity (refusals) or the foreign owner (conflicts)."""
    message: str


@dataclasses.dataclass(frozen=True, slots=True)
class ChildrenDecision:
    """Children to create, and the problems that block the job's pods."""

    create: list[Obj]
    conflicts: list[str]
    """One line per conflicting object."""
    missing_again: list[str]
    """Children that existed once and are gone now (for an Event)."""
    waiting: bool
    """A child of ours is being deleted: create it again once it is gone."""


def key(obj: Mapping[str, Any]) -> ChildKey:
    """(kind, name) of a built child."""
    return str(obj["kind"]), str(obj["metadata"]["name"])


def is_ours(view: ChildView, job_uid: str, job_name: str, retained_pvc: bool) -> bool:
    """Controlled by this job, or the job's own retained checkpoint PVC."""
    if view.owner_uid == job_uid:
        return True
    return retained_pvc and view.kind == "PersistentVolumeClaim" and view.owner_uid is None and \
        view.job_label == job_name


def conflict_text(kind: str, name: str, owner: str | None) -> str:
    """The ChildConflict line for one object."""
    who = f"controlled by another owner (uid {owner})" if owner else "not controlled by any DDPJob"
    return (f"{kind} {name} exists and is {who}; the operator never adopts objects it did not create: "
            "delete or rename it, or rename the DDPJob")


def decide(
    desired: Sequence[Obj],
    observed: Mapping[ChildKey, ChildView],
    problems: Mapping[ChildKey, Problem],
    *,
    job_uid: str,
    job_name: str,
    retained_pvc: bool,
    created_before: bool,
) -> ChildrenDecision:
    """Compare the desired children with what the watches (and the last creates) showed."""
    create: list[Obj] = []
    conflicts: list[str] = []
    missing: list[str] = []
    waiting = False
    for obj in desired:
        k = key(obj)
        view = observed.get(k)
        problem = problems.get(k)
        if view is not None and is_ours(view, job_uid, job_name, retained_pvc):
            waiting = waiting or view.deleting
            continue
        if view is not None and not view.deleting:
            conflicts.append(conflict_text(k[0], k[1], view.owner_uid))
            continue
        if problem is not None and problem.conflict:
            conflicts.append(problem.message)
            create.append(obj)  # try again: the foreign object may be gone by now
            continue
        if view is not None:  # a foreign object on its way out: wait for it
            waiting = True
            continue
        create.append(obj)
        if created_before:
            missing.append(f"{k[0]} {k[1]}")
    return ChildrenDecision(create=create, conflicts=conflicts, missing_again=missing, waiting=waiting)


def refusals(problems: Mapping[ChildKey, Problem]) -> list[Problem]:
    """Creates the API server refused (RBAC, quota, PodSecurity), oldest first."""
    return [p for p in problems.values() if not p.conflict]

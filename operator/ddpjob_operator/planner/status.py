"""Pure status computation: the DDPJob's old status, the observed worker pods and the planner's outcome in,
the new operator-owned status out (conditions per the Kubernetes API conventions), plus the minimal merge
patch and the transition events.

The operator owns every key in OWN_KEYS and nothing else: ``status.progress`` belongs to the worker's rank 0,
so patches never mention it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from ddpjob_worker.contract import STATUS_REPORT_INTERVAL

from ddpjob_operator.api import reasons
from ddpjob_operator.api.formats import format_time
from ddpjob_operator.planner.observation import PodView
from ddpjob_operator.planner.policies.recovery_clock import last_recovery_seconds

# Condition types. A type that is also a reason (Created, Suspended) is that reason's word (api/reasons.py).
CREATED = reasons.CREATED
RUNNING = "Running"
RESTARTING = "Restarting"
SUSPENDED = reasons.SUSPENDED
SUCCEEDED = "Succeeded"
FAILED = "Failed"
CONDITION_TYPES = (CREATED, RUNNING, RESTARTING, SUSPENDED, SUCCEEDED, FAILED)
# Conditions beside the state: each says what blocks or threatens the job while it lasts. Each type is also the
# reason of the Event posted when it becomes True (transition_events), so it is defined in api/reasons.py.
STALLED = reasons.STALLED
CHILD_CONFLICT = reasons.CHILD_CONFLICT
CREATE_REFUSED = reasons.CREATE_REFUSED
QUEUED = reasons.QUEUED
CANNOT_START = reasons.PODS_CANNOT_START
SPEC_REJECTED = reasons.SPEC_REJECTED
STATUS_UNPROTECTED = reasons.STATUS_UNPROTECTED
AUX_TYPES = (STALLED, CHILD_CONFLICT, CREATE_REFUSED, QUEUED, CANNOT_START, SPEC_REJECTED, STATUS_UNPROTECTED)

OWN_KEYS = (
    "conditions",
    "state",
    "observedGeneration",
    "replicas",
    "readyReplicas",
    "succeededReplicas",
    "failedReplicas",
    "ready",
    "spares",
    "lastRecoverySeconds",
    "restarts",
    "incidentCount",
    "incidents",
    "countedFailures",
    "startTime",
    "completionTime",
    "selector",
    STATUS_REPORT_INTERVAL,
)

#: Condition types whose becoming True is a problem worth a Warning event.
# Queued is a wait, not a fault.
_WARNING_TYPES = (RESTARTING, FAILED, STALLED, CHILD_CONFLICT, CREATE_REFUSED, CANNOT_START, STATUS_UNPROTECTED)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outcome:
    """The planner's verdict for this pass: the job's state and why."""

    state: str
    """One of the condition types except Created, or Queued (Kueue holds the job): the job's headline state."""
    reason: str
    """CamelCase reason of the headline condition."""
    message: str
    """Human-readable explanation."""


@dataclasses.dataclass(frozen=True, slots=True)
class Aux:
    """An auxiliary condition this pass: True with its reason, or False (cleared, if it was ever set; written
    even when it never was if ``show``: a False that users must know about)."""

    type: str
    status: bool
    reason: str
    message: str
    show: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class Counts:
    """Everything the status records besides conditions."""

    desired: int
    restarts: int
    spares: int = 0
    """spec.spares: pods beyond ``desired`` wait at the rendezvous and are reported apart."""
    incident_count: int = 0
    incidents: tuple[Mapping[str, Any], ...] = ()
    counted_failures: tuple[str, ...] = ()
    start_time: str | None = None
    completion_time: str | None = None
    selector: str = ""
    report_interval: int | None = None
    """status.reportIntervalSeconds of a job that is not finished (policies/report_cadence.py)."""


def set_condition(
    conditions: Sequence[Mapping[str, Any]],
    ctype: str,
    status: bool,
    reason: str,
    message: str,
    now: datetime,
    generation: int,
) -> list[dict[str, Any]]:
    """Return conditions with ``ctype`` set; lastTransitionTime moves only when the status flips."""
    text = "True" if status else "False"
    out: list[dict[str, Any]] = []
    found = False
    for cond in conditions:
        if cond.get("type") != ctype:
            out.append(dict(cond))
            continue
        found = True
        ltt = cond.get("lastTransitionTime") if cond.get("status") == text else None
        out.append(_condition(ctype, text, reason, message, ltt or format_time(now), generation))
    if not found:
        out.append(_condition(ctype, text, reason, message, format_time(now), generation))
    return out


def _condition(ctype: str, status: str, reason: str, message: str, ltt: str, gen: int) -> dict[str, Any]:
    return {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": ltt,
        "observedGeneration": gen,
    }


def condition_true(status: Mapping[str, Any], ctype: str) -> bool:
    """Whether condition ``ctype`` is True in a status dict."""
    return any(c.get("type") == ctype and c.get("status") == "True" for c in status.get("conditions") or [])


def get_condition(status: Mapping[str, Any], ctype: str) -> Mapping[str, Any] | None:
    """The condition of type ``ctype``, or None."""
    return next((c for c in status.get("conditions") or [] if c.get("type") == ctype), None)


def _conditions(
    old: Mapping[str, Any], outcome: Outcome, aux: Sequence[Aux], now: datetime, generation: int
) -> list[dict[str, Any]]:
    """The conditions after this pass: the state's, then the auxiliary ones."""
    conds: list[dict[str, Any]] = [dict(c) for c in old.get("conditions") or []]
    msg = outcome.message

    def put(ctype: str, status: bool, reason: str, message: str) -> None:
        nonlocal conds
        conds = set_condition(conds, ctype, status, reason, message, now, generation)

    def clear(ctype: str, reason: str, message: str) -> None:
        # A condition that never existed stays absent rather than appearing as False: less noise.
        if get_condition({"conditions": conds}, ctype) is not None:
            put(ctype, False, reason, message)

    state, reason = outcome.state, outcome.reason
    if reason != reasons.INVALID_SPEC:  # an invalid job never had anything created
        put(CREATED, True, reasons.JOB_CREATED, "the operator accepted the DDPJob and manages its pods")
    if state == RUNNING:
        put(RUNNING, True, reason, msg)
        clear(RESTARTING, reasons.WORKERS_RECOVERED, "all workers are running again")
    elif state == CREATED:
        put(RUNNING, False, reason, msg)
    elif state == RESTARTING:
        put(RESTARTING, True, reason, msg)
        put(RUNNING, False, reason, msg)
    elif state == QUEUED:  # Kueue holds the job: the Queued condition (auxiliary) says why
        clear(RUNNING, reason, msg)
        clear(RESTARTING, reason, msg)
    elif state == SUSPENDED:
        put(SUSPENDED, True, reason, msg)
        clear(RUNNING, reason, msg)
        clear(RESTARTING, reason, msg)
    elif state in (SUCCEEDED, FAILED):
        put(state, True, reason, msg)
        clear(RUNNING, reason, msg)
        clear(RESTARTING, reason, msg)
    if state != SUSPENDED:
        clear(SUSPENDED, reasons.RESUMED, "the job was resumed")
    for cond in aux:
        if cond.status or cond.show:
            put(cond.type, cond.status, cond.reason, cond.message)
        else:
            clear(cond.type, cond.reason, cond.message)
    return conds


def compute_status(
    old: Mapping[str, Any],
    *,
    outcome: Outcome,
    workers: Sequence[PodView],
    counts: Counts,
    generation: int,
    now: datetime,
    aux: Sequence[Aux] = (),
) -> dict[str, Any]:
    """The new operator-owned status (every key of OWN_KEYS; None means: remove it)."""
    conds = _conditions(old, outcome, aux, now, generation)
    # Which pods train is the rendezvous' choice, not an index: the first ``desired`` count as workers, the rest
    # as spares, so spares never inflate the worker counts (or the scale subresource's status.replicas).
    n_active = sum(p.active for p in workers)
    n_ready = sum(p.running and p.ready for p in workers)
    active, ready = min(n_active, counts.desired), min(n_ready, counts.desired)
    return {
        "conditions": conds,
        "state": outcome.state,
        "observedGeneration": generation,
        "replicas": active,
        "readyReplicas": ready,
        "succeededReplicas": sum(p.phase == "Succeeded" for p in workers),
        "failedReplicas": sum(p.phase == "Failed" for p in workers),
        "ready": f"{ready}/{counts.desired}",
        "spares": f"{n_ready - ready}/{counts.spares}" if counts.spares else None,
        "lastRecoverySeconds": last_recovery_seconds(counts.incidents),
        "restarts": counts.restarts,
        "incidentCount": counts.incident_count,
        "incidents": [dict(i) for i in counts.incidents] or None,
        "countedFailures": list(counts.counted_failures) or None,
        "startTime": counts.start_time,
        "completionTime": counts.completion_time,
        "selector": counts.selector,
        STATUS_REPORT_INTERVAL: None if outcome.state in (SUCCEEDED, FAILED) else counts.report_interval,
    }


def status_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """JSON merge patch of the keys that changed (None removes a key); empty when nothing changed."""
    return {k: new.get(k) for k in OWN_KEYS if old.get(k) != new.get(k)}


@dataclasses.dataclass(frozen=True)
class Event:
    """A Kubernetes Event to emit on the DDPJob after the status write."""

    type: str
    reason: str
    message: str


def transition_events(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Event]:
    """One Event per condition that became True (the Created/Running/... transitions)."""
    events = []
    for cond in new.get("conditions") or []:
        if cond.get("status") != "True" or condition_true(old, cond["type"]):
            continue
        if cond["type"] == RESTARTING:
            continue  # the planner emits one WorkerFailed Event per failed pod, with its exit code
        if cond["type"] == CREATED:
            continue  # routine: every accepted job has it, and 500 jobs would post 500 Events (operator-scale.md)
        kind = "Warning" if cond["type"] in _WARNING_TYPES else "Normal"
        # An auxiliary condition's Event is named by what happened (Stalled), its reason says why.
        reason = cond["type"] if cond["type"] in AUX_TYPES else cond["reason"]
        events.append(Event(kind, reason, cond.get("message") or cond["type"]))
    return events

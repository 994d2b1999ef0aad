"""Incidents: one cause, one count, whatever the number of pods it takes down.

The rule (docs/api.md, "Incidents"): a loss joins the newest incident when that incident began at most
``runPolicy.incidentWindowSeconds`` before the loss, has not already lost the same pod, and is still recovering,
or the loss is a consequence (an agent that exits 200 or 201: it lost its store or a peer); otherwise the loss
opens a new incident. ``backoffLimit`` counts incidents. So a lost rendezvous store, which
makes every agent exit 200 within seconds, is one incident for 2 workers or 2000, and a node that takes three
workers with it is one incident; but a pod that crashes again after its replacement started is a new incident
(its name is already in the open one), so a crash loop still exhausts the budget instead of hiding inside one
incident for ever. A stall never joins an open incident: restarting the group is a decision of its own.

Counting survives operator crashes the way restarts always did: a lost pod's UID is first recorded
(``status.countedFailures``) together with the incident, and only a later pass that sees that status acts on
the pod; each pod created afterwards carries the incident count in a label, so a stale read cannot lower it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from ddpjob_operator.api.formats import format_time, parse_time, truncate
from ddpjob_operator.api.reasons import NODE_LOST, STALLED
from ddpjob_operator.planner.policies.failure import Loss, pick_cause

#: Incidents kept in status.incidents (the total is status.incidentCount).
MAX_RECENT = 10

RECOVERING = "Recovering"
RECOVERED = "Recovered"
FAILED = "Failed"

Obj = dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """What the incident policy decided this pass."""

    incidents: list[Obj]
    """status.incidents, newest last."""
    count: int
    """status.incidentCount."""
    counted: list[str]
    """UIDs of lost pods now attributed (status.countedFailures)."""
    new_losses: list[tuple[Loss, int]]
    """Losses attributed this pass, with the id of their incident."""
    opened: list[int]
    """Ids of incidents opened this pass."""
    permanent: Loss | None = None
    """A loss that fails the job at once (permanent exit code)."""
    exhausted: bool = False
    """More incidents than backoffLimit: the job fails."""


def _joinable(incident: Mapping[str, Any], loss: Loss, window: int, fresh: bool) -> bool:
    """Whether ``loss`` joins ``incident`` (``fresh``: opened by this very attribution)."""
    if (incident.get("cause") == STALLED) != (loss.cause == STALLED):
        return False  # a stall restarts the group as an incident of its own, joined only by its own pods
    if loss.cause == STALLED and not fresh:
        return False
    outcome = incident.get("outcome")
    if outcome != FAILED and _replacement_lost_with_the_node(incident, loss):
        return True
    # A recovered incident is joined only by its consequences: the job can look recovered (every pod running,
    # training still reporting steps) in the seconds before the agents notice their store is gone and exit 200.
    if outcome == FAILED or (outcome == RECOVERED and not loss.consequential):
        return False
    start = parse_time(incident.get("startTime"))
    if start is None or loss.pod in (incident.get("pods") or []):
        return False
    return loss.at - start <= timedelta(seconds=window)


def _replacement_lost_with_the_node(incident: Mapping[str, Any], loss: Loss) -> bool:
    """A pod that never ran, lost with a node, whose name the incident already lost: the replacement of a pod its
    group found silent can be bound to that very node (still Ready to Kubernetes, nothing else free) and is lost
    with it when Kubernetes calls the node NotReady, 15-40 s on, after a spare may have recovered the incident.
    Part of that loss, not a crash loop (which needs a pod that ran), and no reason to reopen the incident."""
    return loss.never_ran and loss.cause == NODE_LOST and loss.pod in (incident.get("pods") or [])


def _summary(loss: Loss) -> str:
    return truncate(f"{loss.pod}: {loss.detail}", 300)


def attribute(
    incidents: Sequence[Mapping[str, Any]],
    count: int,
    counted: Sequence[str],
    losses: Sequence[Loss],
    *,
    window: int,
    backoff_limit: int,
) -> Decision:
    """Attribute this pass's new losses (UIDs not yet counted) to incidents, oldest loss first."""
    recent = [dict(i) for i in incidents]
    counted_now = list(counted)
    new = sorted((loss for loss in losses if loss.uid not in counted_now), key=lambda x: (x.at, x.pod))
    attributed: list[tuple[Loss, int]] = []
    opened: list[int] = []
    for loss in new:
        last = recent[-1] if recent else None
        if last is not None and _joinable(last, loss, window, int(last["id"]) in opened):
            target = last
        else:
            count += 1
            target = {"id": count, "cause": loss.cause, "startTime": format_time(loss.at), "pods": [],
                      "outcome": RECOVERING, "message": ""}
            if loss.unwatched:
                target["lostUnwatched"] = True  # its start is when the loss was found (policies/recovery_clock.py)
            recent.append(target)
            opened.append(count)
        if target.get("outcome") == RECOVERED and not _replacement_lost_with_the_node(target, loss):
            # reopened by a consequence of its cause
            target["outcome"] = RECOVERING
            target.pop("recoveredTime", None)
            target.pop("recoverySeconds", None)
            target.pop("phases", None)
        if loss.pod not in target.get("pods", []):
            target["pods"] = [*target.get("pods", []), loss.pod]
        cause = pick_cause([target["cause"], loss.cause])
        if not target["message"] or (cause == loss.cause and cause != target["cause"]):
            target["message"] = _summary(loss)  # the message tells the loss that names the incident
        target["cause"] = cause
        counted_now.append(loss.uid)
        attributed.append((loss, int(target["id"])))
    permanent = next((loss for loss, _ in attributed if loss.permanent), None)
    return Decision(
        incidents=recent[-MAX_RECENT:],
        count=count,
        counted=counted_now,
        new_losses=attributed,
        opened=opened,
        permanent=permanent,
        exhausted=count > backoff_limit,
    )


def mark_failed(incidents: Sequence[Mapping[str, Any]]) -> list[Obj]:
    """The job failed: the incident still recovering (if any) ends Failed."""
    out = [dict(i) for i in incidents]
    if out and out[-1].get("outcome") == RECOVERING:
        out[-1]["outcome"] = FAILED
    return out


def mark_succeeded(incidents: Sequence[Mapping[str, Any]], at: datetime) -> list[Obj]:
    """The job succeeded: every worker finished training, so an incident still recovering (a lost store the group
    trained through, a loss in the last seconds) has recovered. Closed at the job's end, without a recovery clock
    (what it would measure is the rest of the run, not the recovery), and the message says so."""
    out = [dict(i) for i in incidents]
    for incident in out:
        if incident.get("outcome") == RECOVERING:
            incident["outcome"] = RECOVERED
            incident["recoveredTime"] = format_time(at)
            incident["message"] = truncate(f"{incident.get('message') or ''} (closed when the job succeeded)".strip())
    return out


def mark_recovered(incidents: Sequence[Mapping[str, Any]], at: datetime,
                   phases: Mapping[str, float] | None = None) -> tuple[list[Obj], Obj | None]:
    """Close the recovering incident (all workers run and training reported progress since it began), with the
    recovery clock's ``phases`` (policies/recovery_clock.py)."""
    out = [dict(i) for i in incidents]
    if not out or out[-1].get("outcome") != RECOVERING:
        return out, None
    last = out[-1]
    start = parse_time(last.get("startTime"))
    last["outcome"] = RECOVERED
    last["recoveredTime"] = format_time(at)
    if start is not None:
        last["recoverySeconds"] = max(0, round((at - start).total_seconds()))
    if phases:
        last["phases"] = dict(phases)
    return out, last


def recovering(incidents: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The newest incident if it is still recovering."""
    return incidents[-1] if incidents and incidents[-1].get("outcome") == RECOVERING else None


def list_text(incidents: Sequence[Mapping[str, Any]], count: int) -> str:
    """The incidents for a Failed condition's message: ``#1 RendezvousLost at T (3 pods); #2 ...``."""
    parts = [f"#{i.get('id')} {i.get('cause')} at {i.get('startTime')} ({len(i.get('pods') or [])} pod(s): "
             f"{i.get('message')})" for i in incidents]
    older = count - len(incidents)
    head = f"{older} older incident(s); " if older > 0 else ""
    return head + "; ".join(parts)

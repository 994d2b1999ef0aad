"""How ``onStall: RestartGroup`` restarts a stalled group: in place, or by replacing its pods.

In place (the default): the operator writes a restart request on every worker pod (an annotation the downward API
projects into the pod, ddpjob_worker.restart_request); each agent stops its trainers (SIGTERM, so they can
checkpoint) and the group re-forms in the same pods. Nothing is lost: the checkpoints on the pods' emptyDirs
stay, no pod waits for a node or an image, and the restart costs no agent restart.

The pods are replaced instead (deleted gracefully and recreated: the old behaviour) when
- the runtime cannot see the job's steps (a command it does not run in-process): rank 0 then keeps no record of
  its group, so the operator could not tell the restarted group from the stalled one;
- the newest incident is an in-place restart of a stall: the group stalled again right after one, so something
  outside the trainers (a node, a device, a mount) may hold them;
- the agents did not answer the request (no new group within ANSWER_SECONDS, ``unanswered``): an old runtime, or
  an agent that hangs itself. The same incident then replaces the pods.

Whether a new group formed is told by identity, not by time: the incident keeps the stalled group's name as rank 0
wrote it (recovery_clock.group_id) and any other name is a new group. The request's time is the operator's clock and
the group's the worker's; compared, a worker behind the operator looked unanswered and had every pod replaced.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from ddpjob_worker.restart_request import Request

from ddpjob_operator.api.formats import parse_time, truncate
from ddpjob_operator.api.reasons import STALLED
from ddpjob_operator.planner.observation import PodView
from ddpjob_operator.planner.policies.failure import Loss
from ddpjob_operator.planner.policies.incidents import RECOVERING
from ddpjob_operator.planner.policies.recovery_clock import STALLED_GROUP, group_id, group_times, regrouped

IN_PLACE = "InPlace"
REPLACE_PODS = "ReplacePods"
#: Seconds the agents get to re-form the group after the request: the kubelet's update of the projected file
#: (seconds: a pod update re-syncs its volumes), torch's 30 s between SIGTERM and SIGKILL of a hung trainer, and
#: the rendezvous.
ANSWER_SECONDS = 120
#: Said of a pod replacement when the checkpoints live on the pods' emptyDirs.
STARTS_OVER = ("; this job has no checkpoint claim, so its checkpoints live on the pods' emptyDir volumes and go "
               "with them: training starts over from step 0 (set spec.checkpoint.volumeClaim or existingClaim to "
               "resume after a restart)")


def is_in_place(incident: Mapping[str, Any] | None) -> bool:
    """Whether ``incident`` is a stall restarted in place."""
    return incident is not None and incident.get("cause") == STALLED and incident.get("restart") == IN_PLACE


def mode(recent: Sequence[Mapping[str, Any]], steps_visible: bool) -> str:
    """How to restart a group that stalled now: IN_PLACE, or REPLACE_PODS (see the module's docstring)."""
    if not steps_visible or (recent and is_in_place(recent[-1])):
        return REPLACE_PODS
    return IN_PLACE


def mark(incident: dict[str, Any], how: str, progress: Mapping[str, Any]) -> None:
    """Record on a stall's new incident how the group is restarted, and for an in-place restart which group stalled
    (the one rank 0's record names now: nothing re-formed, it stalled)."""
    incident["restart"] = how
    if how == IN_PLACE:
        incident[STALLED_GROUP] = group_id(progress)


def loss_key(uid: str, incident_at: datetime) -> str:
    """What the incident attribution counts for a pod restarted in place: not its UID, which must stay free to count
    a real failure of the same pod later (and a pod so counted would be deleted). The next pass drops it from
    ``status.countedFailures`` (it names no pod); the stall is over by then (its clock restarts at the incident)."""
    return f"{uid}@stall:{int(incident_at.timestamp())}"


def request(incident: Mapping[str, Any]) -> Request | None:
    """The restart request of an in-place incident (made at its start), or None."""
    began = parse_time(incident.get("startTime"))
    if not is_in_place(incident) or began is None:
        return None
    return Request(int(incident.get("id") or 0), began.timestamp())


def to_annotate(incident: Mapping[str, Any] | None, workers: Sequence[PodView]) -> list[tuple[PodView, str]]:
    """The running workers of a recovering in-place incident that do not carry its request yet, with the value to
    write (the incident is in the status already: this is a later pass, so an operator crash cannot restart a
    group twice or lose the request)."""
    if incident is None or incident.get("outcome") != RECOVERING:
        return []
    req = request(incident)
    if req is None:
        return []
    text = req.text()
    named = set(incident.get("pods") or [])
    return [(p, text) for p in workers if p.name in named and p.running and p.restart_request != text]


def answer_due(incident: Mapping[str, Any] | None) -> datetime | None:
    """When an in-place incident's agents must have re-formed the group."""
    began = parse_time((incident or {}).get("startTime"))
    return began + timedelta(seconds=ANSWER_SECONDS) if is_in_place(incident) and began is not None else None


def unanswered(incident: Mapping[str, Any] | None, progress: Mapping[str, Any], now: datetime) -> bool:
    """Whether a recovering in-place incident got no new group (rank 0's record) within ANSWER_SECONDS."""
    due = answer_due(incident)
    if incident is None or due is None or incident.get("outcome") != RECOVERING or now < due:
        return False
    new_group = regrouped(incident, progress)
    if new_group is not None:
        return not new_group
    began = parse_time(incident.get("startTime"))  # an incident of an older operator: its time rule
    rdzv, _, _ = group_times(progress)
    return rdzv is None or began is None or rdzv < began


def losses(how: str, workers: Sequence[PodView], counted: Sequence[str], now: datetime, message: str,
           has_claim: bool) -> list[Loss]:
    """One loss per active worker of a group that stalled now, restarted ``how``."""
    active = [p for p in workers if p.active]
    if how == IN_PLACE:
        detail = f"restarted in place (its checkpoints kept): {message}"
        return [Loss(p.name, loss_key(p.uid, now), p.index, STALLED, now, detail) for p in active]
    detail = f"restarted: {message}{'' if has_claim else STARTS_OVER}"
    return [Loss(p.name, p.uid, p.index, STALLED, now, detail) for p in active if p.uid not in counted]


def escalate(incident: dict[str, Any], workers: Sequence[PodView], counted: Sequence[str],
             has_claim: bool) -> tuple[list[str], str]:
    """An unanswered in-place restart replaces the pods within the same incident: the UIDs to count now (their
    pods are deleted gracefully by the next pass) and the incident's new message (``incident`` is updated)."""
    uids = [p.uid for p in workers if p.active and p.uid not in counted]
    said = (f"the agents did not re-form the group within {ANSWER_SECONDS}s of the in-place restart request "
            f"({incident.get('startTime')}): replacing the pods")
    incident["restart"] = REPLACE_PODS
    incident["message"] = truncate(said, 300)
    return uids, said + ("" if has_claim else STARTS_OVER)

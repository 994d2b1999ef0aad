"""The recovery clock: when an incident is over, and how long each phase of its recovery took.

Phases, in seconds from the incident's start (the lost pod's finish or deletion time):
``replacementCreated``, ``scheduled``, ``containerStarted`` (the first worker pod created after the start; the
API server's timestamps have 1 s resolution), then ``rendezvous``, ``checkpointLoaded`` and ``firstStep`` (rank 0's
``status.progress.start``, to the millisecond). With a hot spare the group re-forms before the replacement pod
exists, so the pod phases may come after ``firstStep``: they are reported, not summed. The incident's start is
truncated to the second, so a phase can read up to 1 s long; none reads below 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from ddpjob_operator.api.formats import parse_time
from ddpjob_operator.planner.observation import PodView
from ddpjob_operator.planner.policies import silent

#: Every phase, in the order a recovery without a spare goes through them (the metric's label values).
#: ``detection``: a lost node only, from the peer's silence to the survivor's report (status.progress.lostPeers).
PHASES = ("detection", "replacementCreated", "scheduled", "containerStarted", "rendezvous", "checkpointLoaded",
          "firstStep")
#: The phase that ends a recovery: training runs again.
TOTAL = "firstStep"


def group_times(progress: Mapping[str, Any]) -> tuple[datetime | None, datetime | None, datetime | None]:
    """(rendezvous, checkpoint loaded, first step) of rank 0's current process group (``progress.start``). Rank 0
    announces a new group's rendezvous before its first step, merged into the previous group's record: a
    checkpoint or first-step time older than the rendezvous is the previous group's, so None."""
    start = progress.get("start")
    start = start if isinstance(start, Mapping) else {}
    rdzv = parse_time(start.get("rendezvousTime"))
    loaded, first = parse_time(start.get("checkpointLoadedTime")), parse_time(start.get("firstStepTime"))
    if rdzv is not None:
        loaded = loaded if loaded is not None and loaded >= rdzv else None
        first = first if first is not None and first >= rdzv else None
    return rdzv, loaded, first


#: An in-place restart's incident field: the group that stalled, as rank 0 named it (group_id).
STALLED_GROUP = "stalledGroup"


def group_id(progress: Mapping[str, Any]) -> str:
    """Rank 0's current group as it wrote it (its ``start.rendezvousTime``, verbatim; "" for none). An identity,
    compared for equality only: it is the worker's clock, and the operator's is another machine's."""
    start = progress.get("start")
    value = start.get("rendezvousTime") if isinstance(start, Mapping) else None
    return value if isinstance(value, str) else ""


def regrouped(incident: Mapping[str, Any], progress: Mapping[str, Any]) -> bool | None:
    """Whether a group other than the one that stalled trains now (an in-place restart answered); None for an
    incident that named no group (opened by an operator before stalledGroup)."""
    if STALLED_GROUP not in incident:
        return None
    return group_id(progress) != str(incident.get(STALLED_GROUP) or "")


def _seconds(at: datetime | None, began: datetime) -> float | None:
    return None if at is None else round(max(0.0, (at - began).total_seconds()), 3)


def _detection(began: datetime, progress: Mapping[str, Any]) -> float | None:
    """Seconds from a peer's silence to its group's report of it, for an incident that began at that silence (the
    operator starts a NodeLost incident at ``silentSince``, truncated to the second); None for any other."""
    first = min((r.reported for r in silent.reports(progress).values()
                 if began - timedelta(seconds=1) <= r.since <= began + timedelta(seconds=1) and r.reported >= began),
                default=None)
    return _seconds(first, began)


def phases(began: datetime, workers: Sequence[PodView], progress: Mapping[str, Any]) -> dict[str, float]:
    """The phases seen for an incident that began at ``began`` (only those that happened after it)."""
    out: dict[str, float | None] = {"detection": _detection(began, progress)}
    new = [p for p in workers if p.created_at is not None and p.created_at >= began]
    if new:
        pod = min(new, key=lambda p: (p.created_at, p.name))
        out["replacementCreated"] = _seconds(pod.created_at, began)
        out["scheduled"] = _seconds(pod.scheduled_at, began)
        out["containerStarted"] = _seconds(pod.started_at, began)
    rdzv, loaded, first = group_times(progress)
    if rdzv is not None and rdzv >= began:
        out["rendezvous"] = _seconds(rdzv, began)
        out["checkpointLoaded"] = _seconds(loaded, began)
        out["firstStep"] = _seconds(first, began)
    return {k: v for k, v in out.items() if v is not None}


#: Seconds a step must come after a loss found late (lostUnwatched) to prove the group no longer has the lost pod:
#: the step is stamped by the worker's clock, the start by the operator's.
UNWATCHED_MARGIN_SECONDS = 2.0


def recovered_at(began: datetime | None, running: Sequence[PodView], progress: Mapping[str, Any],
                 now: datetime, unwatched: bool = False) -> datetime | None:
    """When training ran again after an incident that began at ``began``, or None while it has not.

    A worker that reports its clock (``progress.start``) proves it: a group formed after the start and did a
    step (rank 0 announces a new group before its first step: until that step it is not over). Otherwise (a
    command the worker runtime does not run) the newest worker must have started after the start, and progress,
    if any is reported, must be newer than that worker.

    A pod lost while no operator watched (``unwatched``) was lost before ``began``, when it was found missing:
    a hot spare's group may have formed in between. A step after ``began`` proves that group is not the one the
    loss hit (that one cannot step without the pod, which was gone by then), so it ends the incident too."""
    rdzv, _, first = group_times(progress)
    if rdzv is not None and began is not None:
        if rdzv >= began:
            return first
        step = parse_time(progress.get("lastStepTime"))
        late = unwatched and step is not None and step >= began + timedelta(seconds=UNWATCHED_MARGIN_SECONDS)
        return step if late else None
    newest = max((p.started_at for p in running if p.started_at is not None), default=None)
    if began is not None and (newest is None or newest < began):
        # Every worker still runs the group the incident hit: its agents have not noticed yet (a lost store is
        # noticed seconds later), and steps they report now prove nothing.
        return None
    reported = parse_time(progress.get("updateTime"))
    if progress and (reported is None or (newest is not None and reported < newest)):
        return None  # training has not reported a step since the newest worker started
    return reported or now


def store_only(incident: Mapping[str, Any], store_pod: str) -> bool:
    """Whether an incident lost nothing but the rendezvous store pod."""
    return set(incident.get("pods") or []) == {store_pod}


def kept_training(began: datetime | None, running: Sequence[PodView], stores: Sequence[PodView],
                  progress: Mapping[str, Any], now: datetime) -> datetime | None:
    """When an incident that lost only the rendezvous store is over although no group re-formed, or None.

    The agents keep a healthy group training through a lost store and reconnect to the new one
    (ddpjob_worker.storekeeper), so no start record follows the incident. It is over when the group is still the
    one from before it (had it re-formed, recovered_at decides), a new store pod started after it is Ready (its
    probe: the store listens), and training reported progress since that pod started. It ends now: when the
    operator sees all of that (the pod's start is too early: the store then still imports torch before it
    listens).

    The group is the one from before when rank 0's record says so (its rendezvous came before the incident: a
    spare pod that started since, replacing one that took over a lost worker's place, is not in the group), or,
    for a command that keeps no record, when every running worker started before the incident."""
    if began is None or not running:
        return None
    rdzv, _, _ = group_times(progress)
    if rdzv is not None and rdzv >= began:
        return None
    if rdzv is None and any(p.started_at is None or p.started_at >= began for p in running):
        return None
    back = min((p.started_at for p in stores
                if p.running and p.ready and p.started_at is not None and p.started_at >= began), default=None)
    reported = parse_time(progress.get("updateTime"))
    return now if back is not None and reported is not None and reported >= back else None


def over(incident: Mapping[str, Any], store_pod: str, running: Sequence[PodView], workers: Sequence[PodView],
         stores: Sequence[PodView], progress: Mapping[str, Any],
         now: datetime) -> tuple[datetime, dict[str, float]] | None:
    """When the recovering ``incident`` ended and its phases, or None while it goes on: a group formed after it
    trains (recovered_at), or, for a lost store that the group trained through, the new store is up
    (kept_training: the pod phases are then the new store pod's)."""
    began = parse_time(incident.get("startTime"))
    new_group = regrouped(incident, progress)
    if new_group is not None:  # an in-place restart: over at the new group's first step, whatever the clocks say
        at = group_times(progress)[2] if new_group else None
    else:
        at = recovered_at(began, running, progress, now, bool(incident.get("lostUnwatched")))
    if at is not None:
        return at, phases(began, workers, progress) if began is not None else {}
    if began is None or not store_only(incident, store_pod):
        return None
    at = kept_training(began, running, stores, progress, now)
    return (at, phases(began, stores, {})) if at is not None else None


def last_recovery_seconds(incidents: Sequence[Mapping[str, Any]]) -> float | None:
    """What the newest recovered incident cost: its first step after the start, else its recoverySeconds."""
    for incident in reversed(incidents):
        if incident.get("outcome") == "Recovered":
            total = (incident.get("phases") or {}).get(TOTAL)
            value = total if total is not None else incident.get("recoverySeconds")
            return float(value) if value is not None else None
    return None

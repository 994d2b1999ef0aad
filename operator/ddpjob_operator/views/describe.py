"""`kubectl ddpjob describe JOB`: a job's state, progress, last checkpoint, spares, queue, and its incidents as a
timeline with their recovery phases and the Events that belong to them. Pure: job, Events and clock in, text out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from ddpjob_operator.api.spec import MULTIKUEUE_MANAGER, manager_of
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.policies import recovery_clock as recovery
from ddpjob_operator.views import facts

Obj = Mapping[str, Any]

#: The recovery phases in the order a recovery goes through them.
PHASE_ORDER = recovery.PHASES
#: Conditions shown, in this order (the others follow).
CONDITION_ORDER = (st.CREATED, st.QUEUED, st.RUNNING, st.STALLED, st.SUCCEEDED, st.FAILED, st.SUSPENDED)


def _line(label: str, value: str) -> str:
    return f"{label + ':' if label else '':<13}{value}"


def _why(reason: object, message: object) -> str:
    """``(Reason: message)``, ``(Reason)`` or nothing."""
    if not reason:
        return ""
    return f" ({reason}: {message})" if message else f" ({reason})"


def _clock(at: datetime | None) -> str:
    return at.strftime("%H:%M:%S") if at else "--:--:--"


def _state(status: Obj) -> str:
    state = status.get("state") or "Unknown"
    conds = {c.get("type"): c for c in status.get("conditions") or []}
    cond = conds.get(state) or conds.get("Running" if state == "Restarting" else state)
    return f"{state}{_why(cond.get('reason'), cond.get('message'))}" if cond else str(state)


def _progress_lines(status: Obj, now: datetime) -> list[str]:
    p = facts.progress(status, now)
    if p.step is None:
        return [_line("Progress", "no step reported yet")]
    parts = [facts.bar(p.fraction)]
    parts.append(f"{p.fraction:4.0%}" if p.fraction is not None else "")
    parts.append(f"step {p.step}/{p.total}" if p.total else f"step {p.step}")
    if p.epoch is not None:
        parts.append(f"epoch {p.epoch}")
    if p.rate is not None:
        parts.append(f"{p.rate:.2f} steps/s")
    parts.append(f"ETA {facts.duration(p.eta)}" if p.eta is not None else
                 ("ETA - (the script reports no totalSteps)" if not p.total else "ETA -"))
    source = (status.get("progress") or {}).get("source")
    detail = {"Reporter": "reported by the script (rank 0)",
              "OptimizerSteps": "optimizer steps counted by the runtime (rank 0)"}.get(str(source), "rank 0")
    age = f"; last step {facts.duration(p.last_step_age)} ago" if p.last_step_age is not None else ""
    return [_line("Progress", "  ".join(x for x in parts if x)), _line("", f"{detail}{age}")]


def _checkpoint(status: Obj, now: datetime) -> str:
    ckpt = (status.get("progress") or {}).get("lastCheckpoint") or {}
    if "step" not in ckpt:
        return "none reported yet"
    age = facts.since(ckpt.get("time"), now)
    return f"step {ckpt['step']}" + (f", {facts.duration(age)} ago" if age is not None else "")


def _queue(status: Obj) -> str:
    for cond in status.get("conditions") or []:
        if cond.get("type") == st.QUEUED:
            waiting = "waiting" if cond.get("status") == "True" else "not waiting"
            return f"{waiting}{_why(cond.get('reason'), cond.get('message'))}"
    return "-"


def _unprotected(status: Obj) -> list[str]:
    """A line while the operator finds the worker admission policy not in force (planner/policies/isolation.py)."""
    cond = next((c for c in status.get("conditions") or [] if c.get("type") == st.STATUS_UNPROTECTED), None)
    if not cond or cond.get("status") != "True":
        return []
    return [_line("Security", f"status writable by any worker pod of the namespace ({cond.get('reason')}): "
                              f"{cond.get('message')}")]


def _managed(job: Obj, worker_cluster: str | None) -> list[str]:
    """A line for a job that another controller runs (spec.managedBy): its status, if any, is that controller's."""
    manager = manager_of(job)
    if manager == MULTIKUEUE_MANAGER:
        where = f"worker cluster {worker_cluster}" if worker_cluster else "a worker cluster (none yet)"
        return [_line("Managed by", f"{manager}: MultiKueue runs the job in {where}; the state below is that "
                                    "cluster's, copied here")]
    return [_line("Managed by", f"{manager} (spec.managedBy): this operator leaves the job alone")] if manager else []


def _header(job: Obj, now: datetime, worker_cluster: str | None) -> list[str]:
    meta, spec, status = job.get("metadata") or {}, job.get("spec") or {}, job.get("status") or {}
    workers = f"{status.get('ready') or '0/' + str(spec.get('replicas', '?'))} ready"
    if status.get("spares"):
        workers += f", spares {status['spares']} ready/wanted"
    workers += f", {status.get('restarts') or 0} pod(s) replaced"
    started = facts.parse_time(status.get("startTime"))
    age = facts.since(meta.get("creationTimestamp"), now)
    lines = [_line("Name", str(meta.get("name"))), _line("Namespace", str(meta.get("namespace"))),
             *_managed(job, worker_cluster), _line("State", _state(status)), *_unprotected(status),
             _line("Workers", workers),
             _line("Age", facts.duration(age) + (f" (started {started:%Y-%m-%d %H:%M:%S}Z)" if started else ""))]
    lines += _progress_lines(status, now)
    lines.append(_line("Checkpoint", _checkpoint(status, now)))
    lines.append(_line("Queue", _queue(status)))
    gp = facts.goodput(status, now)
    if gp is not None and gp.fraction is not None:
        lines.append(_line("Goodput", f"{gp.fraction:.1%} (failures cost {facts.duration(gp.lost)} of "
                                      f"{facts.duration(gp.elapsed)})"))
    return lines


def _phases(incident: Obj) -> str:
    phases = incident.get("phases") or {}
    known = [p for p in PHASE_ORDER if isinstance(phases.get(p), int | float)]
    known += sorted(p for p in phases if p not in PHASE_ORDER and isinstance(phases[p], int | float))
    return "  ".join(f"{p} +{phases[p]:.1f}s" for p in known) or "no phase yet"


def _incident_lines(incident: Obj, events: Sequence[Obj]) -> list[str]:
    start = facts.parse_time(incident.get("startTime"))
    pods = ", ".join(incident.get("pods") or []) or "-"
    cost = incident.get("recoverySeconds")
    took = f" in {cost:.1f}s" if isinstance(cost, int | float) else ""
    lines = [f"  #{incident.get('id', '?')} {_clock(start)}  {incident.get('cause', '?')}  "
             f"{incident.get('outcome', '?')}{took}  pods: {pods}"]
    if incident.get("message"):
        lines.append(f"      {incident['message']}")
    lines.append(f"      phases: {_phases(incident)}")
    lines += [f"      {_event(e)}" for e in events]
    return lines


def _event(event: Obj) -> str:
    count = event.get("count") or 1
    times = f" (x{count})" if count > 1 else ""
    return (f"{_clock(facts.event_time(event))} {event.get('type', ''):<7} {event.get('reason', '')}: "
            f"{event.get('message', '')}{times}")


def _conditions(status: Obj) -> list[str]:
    conds = sorted(status.get("conditions") or [], key=lambda c: (
        CONDITION_ORDER.index(c["type"]) if c.get("type") in CONDITION_ORDER else len(CONDITION_ORDER)))
    width = max((len(str(c.get("type", ""))) for c in conds), default=0) + 2
    return [f"  {c.get('type', ''):<{width}}{c.get('status', ''):<8}{c.get('reason', '')}: {c.get('message', '')}"
            for c in conds]


def render(job: Obj, events: Sequence[Obj], now: datetime, *, worker_cluster: str | None = None) -> str:
    """The describe text of ``job`` with its Events (involvedObject: the job) at ``now``; ``worker_cluster``: where
    MultiKueue runs it (a manager cluster's job)."""
    status = job.get("status") or {}
    incidents = sorted(status.get("incidents") or [], key=lambda i: i.get("id") or 0)
    owned: dict[int | None, list[Obj]] = {}
    for event in sorted(events, key=lambda e: facts.event_time(e) or now):
        owned.setdefault(facts.owner_of(event, incidents, now), []).append(event)
    lines = _header(job, now, worker_cluster)
    total = status.get("incidentCount") or len(incidents)
    limit = ((job.get("spec") or {}).get("runPolicy") or {}).get("backoffLimit")
    shown = f" (the last {len(incidents)} kept)" if total > len(incidents) else ""
    lines.append(_line("Incidents", f"{total}" + (f" of backoffLimit {limit}" if limit is not None else "") + shown))
    for incident in incidents:
        lines += _incident_lines(incident, owned.get(facts.as_int(incident.get("id")), []))
    lines.append("Conditions:")
    lines += _conditions(status)
    lines.append("Events outside incidents:" if owned.get(None) else "Events outside incidents: none")
    lines += [f"  {_event(e)}" for e in owned.get(None, [])]
    return "\n".join(lines) + "\n"

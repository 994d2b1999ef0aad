"""The recovering incident, each pass: a stall restarted in place gets its request written (or its pods replaced
when the agents leave it unanswered), and an incident ends once training runs again (policies/recovery_clock.py,
policies/stall_restart.py)."""

from __future__ import annotations

from ddpjob_operator.api import names, reasons
from ddpjob_operator.api.formats import truncate
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.children import builders
from ddpjob_operator.planner.pass_state import Pass
from ddpjob_operator.planner.policies import incidents, stall_restart
from ddpjob_operator.planner.policies import recovery_clock as recovery
from ddpjob_operator.planner.types import Plan


def restart_in_place(result: Plan, ps: Pass) -> None:
    """A stall restarted in place: write its request on the workers (a pass after the incident's), or replace the
    pods once the agents left it unanswered."""
    if not ps.recent or incidents.recovering(ps.recent) is None or not stall_restart.is_in_place(ps.recent[-1]):
        return
    last = ps.recent[-1]
    if stall_restart.unanswered(last, ps.old.get("progress") or {}, ps.now):
        uids, text = stall_restart.escalate(last, ps.workers, ps.counted, builders.claim_name(ps.job) is not None)
        ps.counted = [*ps.counted, *uids]
        result.events.append(st.Event("Warning", reasons.RESTART_IN_PLACE_UNANSWERED, truncate(
            f"incident #{last.get('id')} (Stalled): {text}")))
        return
    result.requeue_at(stall_restart.answer_due(last), ps.now)
    # Opened by this pass: the request goes out with the next one, once the incident is written (so that an
    # operator crash in between cannot restart the group twice); the pass that counts a loss asks for the next at
    # once (reconcile._record_losses).
    if any(i.get("id") == last.get("id") for i in ps.old.get("incidents") or []):
        result.annotate_pods = stall_restart.to_annotate(last, ps.workers)


def close_if_over(result: Plan, ps: Pass) -> None:
    """Close the recovering incident once enough workers run and training ran again since it began; record its
    recovery clock."""
    last = incidents.recovering(ps.recent)
    if last is None:
        return
    spec = ps.job.spec
    running = [p for p in ps.workers if p.running and (p.index or 0) < spec.pod_count]
    if len(running) < spec.replicas or not any(p.running for p in ps.rdzv):
        return
    progress = ps.old.get("progress") or {}
    over = recovery.over(last, names.rendezvous_pod_name(ps.job.name), running, ps.workers, ps.rdzv, progress,
                         ps.now)
    if over is None:
        return
    at, phases = over
    ps.recent, closed = incidents.mark_recovered(ps.recent, at, phases)
    if closed is not None:
        result.recovered.append(closed)
        step = f", training at global step {progress.get('globalStep')}" if progress else ""
        clock = ", ".join(f"{k} {v:.1f}s" for k, v in phases.items())
        result.events.append(st.Event("Normal", reasons.INCIDENT_RECOVERED, truncate(
            f"incident #{closed.get('id')} ({closed.get('cause')}) recovered in {closed.get('recoverySeconds')}s"
            f"{step}" + (f" ({clock})" if clock else ""))))

"""The pure planner: a DDPJob, what the operator observes of its children, and the time in; the actions that
converge it out. It composes the policies (policies/): children, failure, incidents, stall, pods, queueing (Kueue,
through admission.py), and the run policies (deadline, success, suspend, ttl), each of which returns a decision.

Level-based and idempotent: the plan depends only on what is observed (plus the DDPJob's own status), so a pass
repeated after a crash, a stale read or a lost watch event plans the same actions again, and every action is
safe to repeat (deterministic names, deletes with UID preconditions, losses counted before they are acted on).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from ddpjob_operator.api import names, reasons
from ddpjob_operator.api.formats import format_time, parse_time, truncate
from ddpjob_operator.api.spec import MULTIKUEUE_MANAGER, DDPJob, InvalidSpec, parse_ddpjob
from ddpjob_operator.planner import open_incident
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.children import builders, inject
from ddpjob_operator.planner.conditions import FINISHED_TYPES, aux_conditions, finished_conditions
from ddpjob_operator.planner.kueue import admission, multikueue, suspension
from ddpjob_operator.planner.kueue import workload as kueue
from ddpjob_operator.planner.kueue.admission import KueueInputs, WorkloadWrite
from ddpjob_operator.planner.kueue.workload import WorkloadView
from ddpjob_operator.planner.observation import PodView
from ddpjob_operator.planner.pass_state import Pass, begin
from ddpjob_operator.planner.policies import (
    blocked,
    children,
    deadline,
    edits,
    failure,
    held,
    incidents,
    isolation,
    pod_verdicts,
    pods,
    rejected,
    silent,
    stall,
    stall_restart,
    status_writes,
    success,
    suspend,
    ttl,
    unreadable,
    unwatched,
)
from ddpjob_operator.planner.policies.pods import DeletePod, Replacement
from ddpjob_operator.planner.types import Observed, Plan

Obj = dict[str, Any]

#: How soon to look again when a name is still taken by an object that is going away.
RETRY_SOON_SECONDS = 1.0
#: How often a job with a conflicting child looks again (the foreign object may carry no label we watch).
CONFLICT_RECHECK_SECONDS = 10.0

__all__ = ["DeletePod", "KueueInputs", "Observed", "Plan", "Replacement", "plan"]


def plan(body: Mapping[str, Any], observed: Observed, now: datetime) -> Plan:
    """Plan one reconcile pass of a DDPJob; a routine status change waits for the next write (status_writes)."""
    result = _plan(body, observed, now)
    if result.invalid is None and result.job is not None and result.job.spec.managed_by == MULTIKUEUE_MANAGER:
        return multikueue.dispatched(result)  # the worker cluster runs it and its status is copied here
    _say_unreadable(result, body.get("status") or {}, observed)
    write = status_writes.decide(result.patch, body.get("status") or {}, result.status, observed.routine_since,
                                 now, observed.routine_wait)
    if not write.now and write.later is not None:
        result.patch, result.status_held = {}, True
        result.requeue_at(write.later, now)
    return result


def _plan(body: Mapping[str, Any], observed: Observed, now: datetime) -> Plan:
    old: Mapping[str, Any] = body.get("status") or {}
    generation = int((body.get("metadata") or {}).get("generation") or 0)
    result = Plan()
    edit: edits.Edit | None = None
    try:
        job = parse_ddpjob(body)
        pod_verdicts.check(job, observed.refused_pods)  # the pod API's word on its pods (a dry run, once per spec)
    except InvalidSpec as err:
        result.invalid, edit = err, edits.decide(body, old, observed.pods, observed.last_valid_spec)
        if edit.action == "ended":
            result.status = dict(old)
            return result
        if edit.action == "fail":
            return _finish_invalid(result, old, err, observed.pods, generation, now)
        if edit.action == "hold" or edit.job is None:
            return _hold_invalid(result, old, edits.condition(err, edit), generation, now)
        job = edit.job
    job = inject.with_operator_image(job, observed.runtime_image)
    result.job = job
    observed = replace(observed, problems=blocked.relevant(observed.problems, job.spec.network_policy_required))
    ps = begin(job, old, observed, now, generation)
    ps.aux.append(edits.condition(result.invalid, edit))
    policy = job.spec.run_policy
    if st.condition_true(old, st.SUCCEEDED) or st.condition_true(old, st.FAILED):
        cond = st.get_condition(old, st.SUCCEEDED if st.condition_true(old, st.SUCCEEDED) else st.FAILED) or {}
        outcome = st.Outcome(state=cond.get("type", st.FAILED), reason=cond.get("reason", ""),
                             message=cond.get("message", ""))
        return _finish(result, ps, outcome)
    if observed.rejected is not None:  # found by this pass's own create: the job fails, its history kept
        return _fail(result, ps, *rejected.failure(observed.rejected))
    queued = kueue.queue_name(job) is not None
    view = _workload_upkeep(result, job, observed) if queued else None
    if policy.suspend:
        return _suspended(result, ps)
    if queued:
        gate = admission.gate(job, view, observed.pods, observed.kueue)
        ps.aux += admission.conditions(gate, view)
        if not gate.run or view is None:
            return _held(result, ps, gate.reason, gate.clear_admission)
        ps.placements, ps.workload = admission.placements(job, view, observed.kueue), view
        ps.job = job = admission.capped(job, ps.placements[names.TYPE_WORKER].count)
    ps.start_time = suspend.start_time_after_resume(False, ps.start_time, format_time(now))
    started = parse_time(ps.start_time)
    if deadline.deadline_exceeded(started, policy.active_deadline_seconds, now):
        limit = policy.active_deadline_seconds
        msg = f"the job was active for more than spec.runPolicy.activeDeadlineSeconds ({limit}s)"
        return _fail(result, ps, reasons.DEADLINE_EXCEEDED, msg)
    result.requeue_at(deadline.deadline_at(started, policy.active_deadline_seconds), now)
    live = [p for p in ps.workers if not p.gone]
    if success.job_succeeded(live, job.spec.rendezvous.close_timeout_seconds, now):
        ps.completion_time = format_time(now)
        done = sum(p.phase == "Succeeded" for p in live)
        outcome = st.Outcome(state=st.SUCCEEDED, reason=reasons.WORKERS_SUCCEEDED,
                             message=f"{done} worker(s) exited 0: training completed")
        return _finish(result, ps, outcome)
    finishing = success.any_succeeded(live)
    if finishing:
        first = success.first_success(live)
        if first is not None:
            result.requeue_at(first + timedelta(seconds=job.spec.rendezvous.close_timeout_seconds), now)
    return _running(result, ps, finishing)


def _running(result: Plan, ps: Pass, finishing: bool) -> Plan:
    """The job is active: ensure children, count losses into incidents, replace pods, watch for stalls."""
    job, now, policy = ps.job, ps.now, ps.job.spec.run_policy
    kids = _children(result, ps)
    reported = silent.reports(ps.old.get("progress"))
    quiet = pods.reported_silent(ps.workers, reported)
    losses = [] if finishing else _losses(ps, reported)
    how = stall_restart.REPLACE_PODS
    verdict = stall.check(ps.old, [p for p in ps.workers if p.active and (p.index or 0) < job.spec.pod_count],
                          [p for p in ps.rdzv if not p.gone], job.spec.replicas,
                          stall.Deadlines(policy.progress_deadline_seconds, policy.startup_deadline_seconds), now,
                          visible=job.spec.steps_visible)
    result.requeue_at(verdict.due, now)
    stalled = verdict.stall
    if stalled is not None and stalled.actionable and not finishing:
        if policy.on_stall == "Fail":
            return _fail(result, ps, reasons.PROGRESS_DEADLINE_EXCEEDED, stalled.message)
        how = stall_restart.mode(ps.recent, job.spec.steps_visible)
        losses += stall_restart.losses(how, ps.workers, ps.counted, now, stalled.message,
                                       builders.claim_name(job) is not None)
    persisted = list(ps.counted)  # pods are acted on only once their count is in the status (a later pass)
    decision = incidents.attribute(ps.recent, ps.count, ps.counted, losses, window=policy.incident_window_seconds,
                                   backoff_limit=policy.backoff_limit)
    ps.recent, ps.count, ps.counted = decision.incidents, decision.count, decision.counted
    for incident in ps.recent:
        if incident["id"] in decision.opened and incident["cause"] == reasons.STALLED:
            stall_restart.mark(incident, how, ps.old.get("progress") or {})
    ps.restarts += sum(1 for loss, _ in decision.new_losses if loss.index is not None)
    result.new_incidents = [i["cause"] for i in ps.recent if i["id"] in decision.opened]
    _record_losses(result, ps, decision)
    if decision.permanent is not None:
        loss = decision.permanent
        return _fail(result, ps, reasons.PERMANENT_EXIT_CODE, f"{loss.pod} failed permanently: {loss.detail}")
    if decision.exhausted:
        msg = (f"{ps.count} incidents exceed spec.runPolicy.backoffLimit ({policy.backoff_limit}): "
               f"{incidents.list_text(ps.recent, ps.count)}")
        return _fail(result, ps, reasons.BACKOFF_LIMIT_EXCEEDED, msg)
    conflicts = list(kids.conflicts)
    hold = blocked.decide(ps.obs.problems)
    pod_plan = _plan_pods(ps, persisted, create=not finishing and not conflicts, quiet=quiet)
    pod_plan.create = unwatched.hold(pod_plan.create, (loss for loss, _ in decision.new_losses))
    if hold.held:  # a name taken (its create is tried again) or a PodGroup or Workload missing
        pod_plan.create = [p for p in pod_plan.create if p["metadata"]["name"] in hold.retry]
    conflicts += [c for c in (*hold.conflicts, *pod_plan.conflicts) if c not in conflicts]
    result.delete_pods, result.create_pods = pod_plan.delete, pod_plan.create
    if ps.placements is not None:
        result.create_pods = admission.place(result.create_pods, ps.placements)
    result.check_pods = pod_verdicts.to_check(job, result.create_pods, ps.obs.accepted_pods)
    result.create_pods = [] if result.check_pods else result.create_pods
    result.replacements = pod_plan.replacements
    for at in pod_plan.recheck:
        result.requeue_at(at, now)
    result.events += [st.Event("Normal", reasons.WORKER_REPLACED, f"replaced worker {r.index} "
                               f"({'no exit code' if r.exit_code is None else f'exit code {r.exit_code}'}); "
                               f"incidents: {ps.count}") for r in pod_plan.replacements]
    if conflicts:  # once more for a conflicting child of _children: the earliest request wins
        result.requeue_at(now + timedelta(seconds=CONFLICT_RECHECK_SECONDS), now)
    open_incident.restart_in_place(result, ps)
    open_incident.close_if_over(result, ps)
    _aux(ps, verdict, conflicts)
    outcome = _state(ps, decision)
    result.workload_writes += admission.pods_ready(job, ps.workload, outcome.state)
    return _with_status(result, ps.old, ps.status(outcome))


def _record_losses(result: Plan, ps: Pass, decision: incidents.Decision) -> None:
    """The Events and log lines of this pass's new losses, and the next pass at once (it acts on them)."""
    result.events += [_loss_event(loss, iid, ps) for loss, iid in decision.new_losses]
    result.losses = [f"incident #{iid} ({loss.cause}): lost {loss.pod} uid={loss.uid} at {format_time(loss.at)}: "
                     f"{loss.detail}" for loss, iid in decision.new_losses]
    if decision.new_losses:
        # A loss is acted on by the pass after this status write, whose own echo plans nothing. Nothing else need
        # bring that pass: a pod its group reported silent changes nothing (its node's NotReady came 11 s later in
        # an e2e run), and a failed pod's last status may have been the event of this pass (the replacement then
        # waited for the resync, 56 s, in tests/integration/test_views.py).
        result.requeue_at(ps.now, ps.now)


def _children(result: Plan, ps: Pass) -> children.ChildrenDecision:
    """Every non-pod child exists and is the job's (suspended jobs too: they keep their PVC and Service)."""
    job, now = ps.job, ps.now
    kids = children.decide(
        [*builders.build_static_children(job), *admission.desired(job, ps.obs.kueue)], ps.obs.children,
        ps.obs.problems, job_uid=job.uid, job_name=job.name,
        retained_pvc=job.spec.checkpoint.keeps_created_claim,
        created_before=st.condition_true(ps.old, st.CREATED),
    )
    result.ensure = kids.create
    result.events += [st.Event("Warning", reasons.CHILD_RECREATED, f"{what} was missing; created it again")
                      for what in kids.missing_again]
    if kids.waiting:
        result.requeue_at(now + timedelta(seconds=RETRY_SOON_SECONDS), now)
    if kids.conflicts:
        result.requeue_at(now + timedelta(seconds=CONFLICT_RECHECK_SECONDS), now)
    return kids


def _losses(ps: Pass, reported: Mapping[str, silent.Report]) -> list[failure.Loss]:
    policy, now, node_ready = ps.job.spec.run_policy, ps.now, ps.obs.node_ready
    out = [loss for p in ps.workers if (p.index or 0) < ps.job.spec.pod_count and p.uid not in ps.obs.deleted
           if (loss := failure.worker_loss(p, policy, node_ready, now)
               or silent.loss(p, reported.get(p.name), node_ready)) is not None]
    out += [loss for p in ps.rdzv if p.uid not in ps.obs.deleted
            if (loss := failure.rendezvous_loss(p, node_ready, now)) is not None]
    if ps.obs.first_pass and ps.old.get("state") in (st.RUNNING, st.RESTARTING):
        out += unwatched.losses(ps.job, ps.workers, ps.rdzv, int(ps.old.get("replicas") or 0), now)
    return out


def _plan_pods(ps: Pass, counted: Sequence[str], *, create: bool, quiet: Collection[str]) -> pods.PodPlan:
    job, now = ps.job, ps.now
    foreign_workers = [p for p in ps.foreign if p.replica_type == names.TYPE_WORKER]
    foreign_rdzv = [p for p in ps.foreign if p.replica_type == names.TYPE_RENDEZVOUS]
    return pods.merge(
        pods.plan_rendezvous(job, ps.rdzv, foreign_rdzv, counted, node_ready=ps.obs.node_ready, create=create,
                             now=now),
        pods.plan_workers(job, ps.workers, foreign_workers, counted, node_ready=ps.obs.node_ready,
                          generation=ps.restarts, incidents=ps.count, create=create, now=now,
                          silent=quiet),
    )


def _loss_event(loss: failure.Loss, incident_id: int, ps: Pass) -> st.Event:
    reason = reasons.RENDEZVOUS_LOST if loss.index is None else reasons.WORKER_FAILED
    who = f"worker {loss.index} (pod {loss.pod})" if loss.index is not None else f"pod {loss.pod}"
    return st.Event("Warning", reason, truncate(
        f"{who}: {loss.detail}; incident #{incident_id} ({loss.cause}), "
        f"{ps.count} of backoffLimit {ps.job.spec.run_policy.backoff_limit}"))


def _aux(ps: Pass, verdict: stall.Verdict | None, conflicts: Sequence[str]) -> None:
    found = aux_conditions(ps.recent, verdict, conflicts, ps.obs.problems, [*ps.workers, *ps.rdzv],
                           gang=ps.job.spec.scheduling.gang is not None) + isolation.condition(ps.obs.worker_isolation)
    kueue_queued = next((a for a in ps.aux if a.type == st.QUEUED), None)
    if kueue_queued is not None:  # Kueue's word while it holds the job, the scheduler's once it is admitted
        if kueue_queued.status:
            found = [a for a in found if a.type != st.QUEUED]
        else:
            ps.aux.remove(kueue_queued)
    ps.aux += found


def _state(ps: Pass, decision: incidents.Decision) -> st.Outcome:
    spec = ps.job.spec
    # Spares are pods too, but never more workers than spec.replicas: the rendezvous admits no more.
    n_running = min(spec.replicas, sum(p.running and p.index is not None and p.index < spec.pod_count
                                       for p in ps.workers))
    rdzv_running = any(p.running for p in ps.rdzv)
    last = incidents.recovering(ps.recent)
    if last is not None and (decision.new_losses or n_running < spec.replicas or not rdzv_running):
        msg = (f"incident #{last.get('id')} ({last.get('cause')}): {last.get('message')}; "
               f"{n_running}/{spec.replicas} worker(s) running; incidents {ps.count} of backoffLimit "
               f"{spec.run_policy.backoff_limit}")
        return st.Outcome(state=st.RESTARTING, reason=str(last.get("cause")), message=truncate(msg))
    if n_running >= spec.replicas and rdzv_running:
        return st.Outcome(state=st.RUNNING, reason=reasons.ALL_WORKERS_RUNNING,
                          message=f"{n_running} worker(s) running")
    msg = f"{n_running}/{spec.replicas} worker(s) running"
    return st.Outcome(state=st.CREATED, reason=reasons.WORKERS_STARTING, message=msg)


def _workload_upkeep(result: Plan, job: DDPJob, observed: Observed) -> WorkloadView | None:
    """A queued job's Workload as seen, and this pass's writes to keep it the job's: its owner (a prebuilt one) and
    spec.active following spec.runPolicy.suspend (kueue/suspension.py)."""
    view = admission.workload_view(job, observed.children)
    result.workload_writes += admission.adopt(job, observed.children)
    result.workload_writes += suspension.writes(kueue.workload_name(job), view, suspended=job.spec.run_policy.suspend,
                                                pods_active=admission.pods_active(job, observed.pods))
    return view


def _suspended(result: Plan, ps: Pass) -> Plan:
    """Suspended: no pods, but the PVC, the Service and the counts stay; a queued job's Workload is deactivated
    (_workload_upkeep)."""
    return _held(result, ps, reasons.SUSPENDED, None)


def _held(result: Plan, ps: Pass, reason: str, clear_admission: str | None) -> Plan:
    """Suspended, or queued in Kueue (not admitted, evicted): no pods, but the PVC, the Service, the Workload and
    the counts stay. Not an incident: the deleted pods count against nothing."""
    ps.start_time = suspend.start_time_after_resume(True, ps.start_time, format_time(ps.now))
    kids = _children(result, ps)
    _aux(ps, None, kids.conflicts)
    doomed = held.plan_pods([p for p in ps.obs.pods if p.owner_uid == ps.job.uid], reason,
                            node_ready=ps.obs.node_ready,
                            timeout_seconds=ps.job.spec.run_policy.terminating_node_timeout_seconds, now=ps.now)
    result.delete_pods = doomed.delete
    for at in doomed.recheck:
        result.requeue_at(at, ps.now)
    if reason == reasons.SUSPENDED:
        outcome = st.Outcome(state=st.SUSPENDED, reason=reason, message="spec.runPolicy.suspend is true: pods deleted")
    else:
        queued = next(a for a in ps.aux if a.type == st.QUEUED)
        outcome = st.Outcome(state=st.QUEUED, reason=reason, message=queued.message)
    if clear_admission is not None:
        result.workload_writes.append(WorkloadWrite(kueue.workload_name(ps.job), "clear", clear_admission,
                                                    outcome.message))
    return _with_status(result, ps.old, ps.status(outcome))


def _fail(result: Plan, ps: Pass, reason: str, message: str) -> Plan:
    ps.completion_time = format_time(ps.now)
    return _finish(result, ps, st.Outcome(state=st.FAILED, reason=reason, message=truncate(message)))


def _finish(result: Plan, ps: Pass, outcome: st.Outcome) -> Plan:
    """A finished job: close its open incident, apply cleanPodPolicy and the TTL; never create anything again."""
    policy = ps.job.spec.run_policy
    if outcome.state == st.SUCCEEDED:
        ps.recent = incidents.mark_succeeded(ps.recent, parse_time(ps.completion_time) or ps.now)
    else:
        ps.recent = incidents.mark_failed(ps.recent)
    for pod in ps.obs.pods:
        if pod.deleting or pod.gone or pod.owner_uid != ps.job.uid:
            continue
        if policy.clean_pod_policy == "All" or (policy.clean_pod_policy == "Running" and not pod.terminated):
            result.delete_pods.append(DeletePod(pod.name, pod.uid, pod.terminated, reasons.JOB_FINISHED))
    ps.aux = [a for a in ps.aux if a.type not in FINISHED_TYPES] + finished_conditions(outcome.state)
    new = ps.status(outcome)
    result.workload_writes += admission.finish(ps.job, admission.workload_view(ps.job, ps.obs.children),
                                               outcome.state == st.SUCCEEDED, outcome.message)
    done = parse_time(new.get("completionTime"))
    if ttl.ttl_expired(done, policy.ttl_seconds_after_finished, ps.now):
        result.delete_job = True
    else:
        result.requeue_at(ttl.ttl_expires_at(done, policy.ttl_seconds_after_finished), ps.now)
    return _with_status(result, ps.old, new)


def _finish_invalid(
    result: Plan, old: Mapping[str, Any], err: InvalidSpec, pods_: Sequence[PodView], gen: int, now: datetime
) -> Plan:
    result.invalid = err
    outcome = st.Outcome(state=st.FAILED, reason=reasons.INVALID_SPEC, message=truncate(str(err)))
    counts = st.Counts(
        desired=0,
        restarts=int(old.get("restarts") or 0),
        incident_count=int(old.get("incidentCount") or 0),
        incidents=tuple(old.get("incidents") or ()),
        start_time=old.get("startTime"),
        completion_time=old.get("completionTime") or format_time(now),
    )
    workers = [p for p in pods_ if p.replica_type == names.TYPE_WORKER and not p.gone]
    return _with_status(
        result,
        old,
        st.compute_status(old, outcome=outcome, workers=workers, counts=counts, generation=gen, now=now),
    )


def _hold_invalid(result: Plan, old: Mapping[str, Any], cond: st.Aux, gen: int, now: datetime) -> Plan:
    """An invalid edit the operator has no valid spec for: the job's pods and state stay, the condition says why."""
    new = dict(old)
    new["conditions"] = st.set_condition(old.get("conditions") or [], cond.type, cond.status, cond.reason,
                                         cond.message, now, gen)
    return _with_status(result, old, new)


def _say_unreadable(result: Plan, old: Mapping[str, Any], observed: Observed) -> None:
    """One Warning Event for the times in status.progress found unreadable and not said before (ignored)."""
    unread = {k: v for k, v in unreadable.times(old.get("progress")).items() if k not in observed.unreadable_said}
    if unread:
        result.unreadable = dict(sorted(unread.items()))
        result.events.append(st.Event("Warning", reasons.PROGRESS_UNREADABLE, unreadable.message(unread)))


def _with_status(result: Plan, old: Mapping[str, Any], new: Obj) -> Plan:
    result.status = new
    result.patch = st.status_patch(old, new)
    # Transition events go after the per-pod ones collected above, as they happened in that order.
    result.events.extend(st.transition_events(old, new))
    return result

"""The pure planner: a DDPJob, its observed pods and the time in; the actions that converge it out.

Level-based and idempotent: the plan depends only on what is observed (plus the DDPJob's own status), so a
pass repeated after a crash, a stale read or a lost watch event plans the same actions again, and every
action is safe to repeat (deterministic pod names, deletes with UID preconditions).

Restart counting survives any crash: a failed worker pod is first *counted* (its UID goes into
``status.countedFailures`` and ``status.restarts`` grows, in this pass's status write) and only deleted and
replaced in a later pass that sees the count persisted. A crash before the write recounts the same pod to
the same total; a crash after it finds the UID already counted. The replacement carries the new total in its
``restart-generation`` label, so even a stale status read can never lower ``status.restarts``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from ddpjob_operator import builders, names
from ddpjob_operator import status as st
from ddpjob_operator.observed import PodView, format_time, parse_time, truncate
from ddpjob_operator.policies import deadline, stuck, success, suspend, ttl
from ddpjob_operator.policies.restart import ExitAction, backoff_exhausted, restart_policy_for_exit_code
from ddpjob_operator.spec import DDPJob, InvalidSpec, parse_ddpjob

Obj = dict[str, Any]

#: How soon to look again when a pod name is still taken by a pod that is going away.
RETRY_SOON_SECONDS = 1.0


@dataclasses.dataclass(frozen=True, slots=True)
class DeletePod:
    """Delete one pod; ``force`` sets gracePeriodSeconds=0 (stuck pods, or pods already terminated)."""

    name: str
    uid: str
    force: bool
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class Replacement:
    """A failed worker being replaced in this pass (for the failure->replacement metric and the Event)."""

    index: int
    exit_code: int | None
    failed_at: datetime | None


@dataclasses.dataclass(kw_only=True)
class Plan:
    """Everything one pass should do, in order: ensure children, delete pods, create pods, write status,
    emit events."""

    job: DDPJob | None = None
    status: Obj = dataclasses.field(default_factory=dict)
    patch: Obj = dataclasses.field(default_factory=dict)
    ensure: list[Obj] = dataclasses.field(default_factory=list)
    delete_pods: list[DeletePod] = dataclasses.field(default_factory=list)
    create_pods: list[Obj] = dataclasses.field(default_factory=list)
    replacements: list[Replacement] = dataclasses.field(default_factory=list)
    delete_job: bool = False
    events: list[st.Event] = dataclasses.field(default_factory=list)
    requeue_after: float | None = None
    invalid: InvalidSpec | None = None

    def requeue_at(self, when: datetime | None, now: datetime) -> None:
        """Ask for another pass at ``when`` (the earliest request wins)."""
        if when is None:
            return
        delay = max(0.0, (when - now).total_seconds())
        self.requeue_after = delay if self.requeue_after is None else min(self.requeue_after, delay)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Observed:
    """The job's children as the operator sees them."""

    pods: Sequence[PodView] = ()
    node_ready: Mapping[str, bool] = dataclasses.field(default_factory=dict)
    restarts_floor: int = 0
    """Highest restart count this operator process has written for the job (guards against stale reads)."""


def plan(body: Mapping[str, Any], observed: Observed, now: datetime) -> Plan:
    """Plan one reconcile pass of a DDPJob."""
    old: Mapping[str, Any] = body.get("status") or {}
    meta = body.get("metadata") or {}
    generation = int(meta.get("generation") or 0)
    result = Plan()
    try:
        job = parse_ddpjob(body)
    except InvalidSpec as err:
        return _finish_invalid(result, old, err, observed.pods, generation, now)
    result.job = job
    spec, policy = job.spec, job.spec.run_policy
    workers = [p for p in observed.pods if p.replica_type == names.TYPE_WORKER]
    rdzv = [p for p in observed.pods if p.replica_type == names.TYPE_RENDEZVOUS]
    restarts = max([int(old.get("restarts") or 0), observed.restarts_floor, *(p.generation for p in workers)])
    counted = [u for u in old.get("countedFailures") or [] if any(p.uid == u for p in workers)]
    last_failure: Mapping[str, Any] | None = None
    start_time = old.get("startTime")
    completion_time = old.get("completionTime")

    def status_for(outcome: st.Outcome) -> Obj:
        counts = st.Counts(
            desired=spec.replicas,
            restarts=restarts,
            counted_failures=tuple(counted),
            last_failure=last_failure,
            start_time=start_time,
            completion_time=completion_time,
            selector=names.selector(job.name),
        )
        return st.compute_status(old, outcome=outcome, workers=workers, counts=counts, generation=generation, now=now)

    # --- finished: clean up, then wait for the TTL ---
    finished = st.condition_true(old, st.SUCCEEDED) or st.condition_true(old, st.FAILED)
    if finished:
        cond = st.get_condition(old, st.SUCCEEDED if st.condition_true(old, st.SUCCEEDED) else st.FAILED) or {}
        outcome = st.Outcome(
            state=cond.get("type", st.FAILED), reason=cond.get("reason", ""), message=cond.get("message", "")
        )
        return _finish(result, old, status_for(outcome), job, observed.pods, now)

    # --- suspended: no pods, keep PVC, Service and counts ---
    if policy.suspend:
        start_time = suspend.start_time_after_resume(True, start_time, format_time(now))
        result.delete_pods = [
            DeletePod(p.name, p.uid, p.terminated, "Suspended")
            for p in suspend.pods_to_delete_on_suspend(observed.pods)
        ]
        outcome = st.Outcome(
            state=st.SUSPENDED, reason="Suspended", message="spec.runPolicy.suspend is true: pods deleted"
        )
        return _with_status(result, old, status_for(outcome))
    start_time = suspend.start_time_after_resume(False, start_time, format_time(now))

    # --- deadline ---
    started = parse_time(start_time)
    if deadline.deadline_exceeded(started, policy.active_deadline_seconds, now):
        completion_time = format_time(now)
        limit = policy.active_deadline_seconds
        msg = f"the job was active for more than spec.runPolicy.activeDeadlineSeconds ({limit}s)"
        return _finish(
            result,
            old,
            status_for(st.Outcome(state=st.FAILED, reason="DeadlineExceeded", message=msg)),
            job,
            observed.pods,
            now,
        )
    result.requeue_at(deadline.deadline_at(started, policy.active_deadline_seconds), now)

    # --- success ---
    if success.job_succeeded(workers, spec.rendezvous.close_timeout_seconds, now):
        completion_time = format_time(now)
        done = sum(p.phase == "Succeeded" for p in workers)
        outcome = st.Outcome(
            state=st.SUCCEEDED,
            reason="WorkersSucceeded",
            message=f"{done} worker(s) exited 0: training completed",
        )
        return _finish(result, old, status_for(outcome), job, observed.pods, now)
    finishing = success.any_succeeded(workers)
    if finishing:
        first = success.first_success(workers)
        if first is not None:
            result.requeue_at(first + timedelta(seconds=spec.rendezvous.close_timeout_seconds), now)

    # --- failed and stuck workers ---
    replacing: dict[int, PodView] = {}
    newly_failed: list[PodView] = []
    for pod in sorted(workers, key=lambda p: (p.index if p.index is not None else -1, p.name)):
        if pod.index is None:
            continue
        stuck_pod = pod.deleting and stuck.is_stuck_terminating(
            pod, observed.node_ready, policy.terminating_node_timeout_seconds, now
        )
        if pod.deleting and not stuck_pod:
            result.requeue_at(stuck.stuck_check_at(pod, policy.terminating_node_timeout_seconds), now)
            continue
        if not (pod.phase == "Failed" or stuck_pod) or finishing:
            continue
        if pod.index >= spec.replicas:  # scaled away while failing: nothing to replace
            result.delete_pods.append(DeletePod(pod.name, pod.uid, True, "ScaledDown"))
            continue
        if pod.phase == "Failed" and restart_policy_for_exit_code(pod.exit_code, policy) is ExitAction.FAIL:
            completion_time = format_time(now)
            msg = _failure_text(pod, "permanent")
            last_failure = _failure_record(pod, now)
            outcome = st.Outcome(state=st.FAILED, reason="PermanentExitCode", message=msg)
            return _finish(result, old, status_for(outcome), job, observed.pods, now)
        if pod.uid in counted:
            replacing[pod.index] = pod
            result.delete_pods.append(DeletePod(pod.name, pod.uid, True, "Replaced"))
        else:
            newly_failed.append(pod)

    if newly_failed:
        restarts += len(newly_failed)
        counted.extend(p.uid for p in newly_failed)
        last_failure = _failure_record(newly_failed[-1], now)
        for pod in newly_failed:
            result.events.append(
                st.Event(
                    "Warning",
                    "WorkerFailed",
                    _failure_text(pod, f"restart {restarts} of {policy.backoff_limit}"),
                )
            )
        if backoff_exhausted(restarts, policy):
            completion_time = format_time(now)
            msg = (
                f"{restarts} worker failures exceed spec.runPolicy.backoffLimit ({policy.backoff_limit}); "
                f"last: {_failure_text(newly_failed[-1], 'retryable')}"
            )
            return _finish(
                result,
                old,
                status_for(st.Outcome(state=st.FAILED, reason="BackoffLimitExceeded", message=truncate(msg))),
                job,
                observed.pods,
                now,
            )

    # --- scale down: delete workers above spec.replicas ---
    for pod in workers:
        if pod.index is not None and pod.index >= spec.replicas and pod.active:
            result.delete_pods.append(DeletePod(pod.name, pod.uid, False, "ScaledDown"))

    # --- create missing workers (deterministic names: a repeat is a harmless 409) ---
    taken = {p.index for p in workers if p.index is not None and p.index not in replacing}
    if not finishing:
        result.ensure = builders.build_static_children(job)
        for i in range(spec.replicas):
            if i in taken:
                continue
            result.create_pods.append(builders.build_worker_pod(job, i, generation=restarts))
            gone = replacing.get(i)
            if gone is not None:
                result.replacements.append(Replacement(i, gone.exit_code, gone.finished_at or gone.deletion_timestamp))
                result.events.append(st.Event("Normal", "WorkerReplaced", _replace_text(gone, restarts)))

    # --- the rendezvous store ---
    if not finishing:
        _plan_rendezvous(result, job, rdzv, observed.node_ready, now)

    # --- status ---
    n_running = sum(p.running and p.index is not None and p.index < spec.replicas for p in workers)
    if newly_failed or replacing or (st.condition_true(old, st.RESTARTING) and n_running < spec.replicas):
        failure = last_failure or old.get("lastFailure") or {}
        outcome = st.Outcome(state=st.RESTARTING, reason="WorkerFailed", message=_restarting_text(failure, restarts))
    elif n_running >= spec.replicas and any(p.running for p in rdzv):
        outcome = st.Outcome(state=st.RUNNING, reason="AllWorkersRunning", message=f"{n_running} worker(s) running")
    else:
        outcome = st.Outcome(
            state=st.CREATED,
            reason="WorkersStarting",
            message=f"{n_running}/{spec.replicas} worker(s) running",
        )
    return _with_status(result, old, status_for(outcome))


def _plan_rendezvous(
    result: Plan, job: DDPJob, rdzv: Sequence[PodView], node_ready: Mapping[str, bool], now: datetime
) -> None:
    """Keep exactly one live rendezvous pod; replace it when it ended or is stuck on a lost node."""
    timeout = job.spec.run_policy.terminating_node_timeout_seconds
    name_taken = False
    for pod in rdzv:
        if pod.deleting and stuck.is_stuck_terminating(pod, node_ready, timeout, now):
            result.delete_pods.append(DeletePod(pod.name, pod.uid, True, "NodeNotReady"))
            result.events.append(
                st.Event(
                    "Warning",
                    "RendezvousRestarted",
                    f"rendezvous pod {pod.name} is stuck "
                    f"Terminating on NotReady node {pod.node_name}; force-deleted, recreating it",
                )
            )
        elif pod.deleting:
            name_taken = True
            result.requeue_at(stuck.stuck_check_at(pod, timeout), now)
        elif pod.terminated:  # evicted, node lost, or exited: replace it; the workers re-rendezvous
            result.delete_pods.append(DeletePod(pod.name, pod.uid, True, "RendezvousEnded"))
            result.events.append(
                st.Event(
                    "Warning",
                    "RendezvousRestarted",
                    f"rendezvous pod {pod.name} ended ({pod.reason or pod.phase}); recreating it",
                )
            )
        else:
            return
    if not name_taken:
        result.create_pods.insert(0, builders.build_rendezvous_pod(job))


def _finish(
    result: Plan, old: Mapping[str, Any], new: Obj, job: DDPJob, pods: Sequence[PodView], now: datetime
) -> Plan:
    """A finished job: apply cleanPodPolicy and the TTL; never create anything again."""
    policy = job.spec.run_policy
    for pod in pods:
        if pod.deleting:
            continue
        if policy.clean_pod_policy == "All" or (policy.clean_pod_policy == "Running" and not pod.terminated):
            result.delete_pods.append(DeletePod(pod.name, pod.uid, pod.terminated, "JobFinished"))
    done = parse_time(new.get("completionTime"))
    if ttl.ttl_expired(done, policy.ttl_seconds_after_finished, now):
        result.delete_job = True
    else:
        result.requeue_at(ttl.ttl_expires_at(done, policy.ttl_seconds_after_finished), now)
    return _with_status(result, old, new)


def _finish_invalid(
    result: Plan, old: Mapping[str, Any], err: InvalidSpec, pods: Sequence[PodView], gen: int, now: datetime
) -> Plan:
    result.invalid = err
    outcome = st.Outcome(state=st.FAILED, reason="InvalidSpec", message=truncate(str(err)))
    counts = st.Counts(
        desired=0,
        restarts=int(old.get("restarts") or 0),
        start_time=old.get("startTime"),
        completion_time=old.get("completionTime") or format_time(now),
    )
    workers = [p for p in pods if p.replica_type == names.TYPE_WORKER]
    return _with_status(
        result,
        old,
        st.compute_status(old, outcome=outcome, workers=workers, counts=counts, generation=gen, now=now),
    )


def _with_status(result: Plan, old: Mapping[str, Any], new: Obj) -> Plan:
    result.status = new
    result.patch = st.status_patch(old, new)
    # Transition events go after the per-pod ones collected above, as they happened in that order.
    result.events.extend(st.transition_events(old, new))
    return result


def _failure_text(pod: PodView, what: str) -> str:
    code = "no exit code" if pod.exit_code is None else f"exit code {pod.exit_code}"
    why = f" ({pod.reason})" if pod.reason and pod.reason not in ("Error", "Completed") else ""
    if pod.deleting and pod.phase != "Failed":
        code, why = "stuck Terminating", f" on NotReady node {pod.node_name}"
    text = f"worker {pod.index} (pod {pod.name}) failed with {code}{why}, {what}"
    if pod.termination_message:
        text += f": {pod.termination_message}"
    return truncate(text)


def _failure_record(pod: PodView, now: datetime) -> Obj:
    return {
        "index": pod.index,
        "podName": pod.name,
        "exitCode": pod.exit_code,
        "reason": pod.reason or ("NodeNotReady" if pod.deleting else "Error"),
        "message": truncate(pod.termination_message, 500),
        "time": format_time(pod.finished_at or now),
    }


def _replace_text(pod: PodView, restarts: int) -> str:
    code = "no exit code" if pod.exit_code is None else f"exit code {pod.exit_code}"
    return f"replaced worker {pod.index} (pod {pod.name}, {code}); restarts: {restarts}"


def _restarting_text(failure: Mapping[str, Any], restarts: int) -> str:
    if not failure:
        return f"replacing failed workers (restarts: {restarts})"
    code = failure.get("exitCode")
    return f"replacing worker {failure.get('index')} after exit code {code} (restarts: {restarts})"

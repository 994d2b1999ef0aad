"""Carrying out one plan against the API server, in two steps: the children, then the pods (deletes, restart
requests, creates); remembering what the API server answered (a name taken by a foreign object, a refused create)
so that the planner can plan again with it between the steps and before the status write. Decides nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ddpjob_worker.restart_request import RESTART_ANNOTATION

from ddpjob_operator.api import reasons
from ddpjob_operator.api.names import LABEL_REPLICA_TYPE, TYPE_RENDEZVOUS
from ddpjob_operator.api.spec import DDPJob
from ddpjob_operator.kube.client import Created, Kube, adopt
from ddpjob_operator.kube.identity import WorkerIdentity
from ddpjob_operator.metrics import registry as metrics
from ddpjob_operator.planner import plan as planner
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.observation import ChildView, PodView
from ddpjob_operator.planner.policies import children
from ddpjob_operator.planner.policies.children import ChildKey, Problem
from ddpjob_operator.runtime.memory import JobMemory

Obj = dict[str, Any]


def owned(obj: Obj, job: DDPJob, body: Mapping[str, Any]) -> Obj:
    """Children get a controller ownerReference, except a PVC the user asked to keep after deletion."""
    if obj["kind"] == "PersistentVolumeClaim" and job.spec.checkpoint.keeps_created_claim:
        return obj
    return adopt(obj, body)


def _answer(job: DDPJob, obj: Obj, result: Created) -> Problem | None:
    """The problem a create's answer is, or None when the child now exists and is the job's."""
    kind, name = obj["kind"], obj["metadata"]["name"]
    if result.refused is not None:
        return result.refused
    if result.existing is None:
        return None
    view = ChildView.from_object(result.existing, kind)
    if children.is_ours(view, job.uid, job.name, job.spec.checkpoint.keeps_created_claim) or view.deleting:
        return None
    return Problem(kind=kind, name=name, conflict=True, reason=reasons.CHILD_CONFLICT,
                   message=children.conflict_text(kind, name, view.owner_uid))


async def apply_children(kube: Kube, key: tuple[str, str], mem: JobMemory, plan: planner.Plan,
                         identity: WorkerIdentity) -> bool:
    """Make sure the namespace's worker identity and the plan's children exist; True when the API server's answers
    changed what the pass knows (a conflict, a refusal, one of them gone)."""
    assert plan.job is not None
    job, body = plan.job, mem.body
    before = dict(mem.problems)
    if plan.status.get("state") not in (st.SUCCEEDED, st.FAILED) and not plan.dispatch_only:  # the pods need it
        for child, problem in await identity.ensure(kube, key[0]):
            _record(mem, child, problem)
    ensure = await asyncio.gather(*(kube.create(owned(dict(obj), job, body)) for obj in plan.ensure))
    for obj, result in zip(plan.ensure, ensure, strict=True):
        _record(mem, children.key(obj), _answer(job, obj, result))
    return before != mem.problems


async def apply_pods(kube: Kube, key: tuple[str, str], mem: JobMemory, plan: planner.Plan,
                     identity: WorkerIdentity) -> bool:
    """Delete, annotate and create the plan's pods (the planner held back any that must not start); True when the
    API server's answers to the creates changed what the pass knows."""
    assert plan.job is not None
    job, body = plan.job, mem.body
    before = dict(mem.problems)
    for d in plan.delete_pods:  # before creates: a replacement reuses the deleted pod's name
        deleted = await kube.delete_pod(key[0], d.name, d.uid, force=d.force)
        mem.deleted_uids.add(d.uid)
        if deleted and d.force:
            mem.gone_uids.add(d.uid)
    for target, text in plan.annotate_pods:  # an in-place restart request (policies/stall_restart)
        await kube.annotate_pod(key[0], target.name, target.uid, {RESTART_ANNOTATION: text})
    results = await asyncio.gather(*(kube.create(adopt(pod, body)) for pod in plan.create_pods))
    for pod, result in zip(plan.create_pods, results, strict=True):
        _record(mem, children.key(pod), _answer(job, pod, result))
        if result.refused is not None:  # perhaps the namespace's worker ServiceAccount is gone: look again
            identity.forget(key[0])
        if result.obj is None:
            mem.name_taken = mem.name_taken or result.refused is None
            continue
        view = PodView.from_pod(result.obj)
        mem.expected[view.name] = (view, time.monotonic())
        kind = "rendezvous" if pod["metadata"]["labels"].get(LABEL_REPLICA_TYPE) == TYPE_RENDEZVOUS else "worker"
        metrics.PODS_CREATED.labels(type=kind).inc()
    _observe(plan)
    return before != mem.problems


def answered(replan: planner.Plan, done: planner.Plan, *, pods: bool) -> planner.Plan:
    """The re-plan with the API server's answers, taken whole (its status, Events, next pass, Kueue writes, TTL
    delete) less the actions this pass already took: the children, and after the pods' step the pods. Those stay as
    ``done`` took them, for the log; none is taken twice, and the metrics of the pods' step are not counted twice."""
    out = dataclasses.replace(replan, ensure=done.ensure)
    if pods:
        out = dataclasses.replace(out, delete_pods=done.delete_pods, annotate_pods=done.annotate_pods,
                                  create_pods=done.create_pods, replacements=done.replacements,
                                  new_incidents=done.new_incidents, recovered=done.recovered)
    return out


def _record(mem: JobMemory, k: ChildKey, problem: Problem | None) -> None:
    if problem is None:
        mem.problems.pop(k, None)
    else:
        mem.problems[k] = problem


def _observe(plan: planner.Plan) -> None:
    now = datetime.now(UTC)
    for rep in plan.replacements:
        metrics.PODS_REPLACED.labels(exit_class=metrics.exit_class(rep.exit_code)).inc()
        if rep.failed_at is not None:
            metrics.FAILURE_TO_REPLACEMENT.observe(max(0.0, (now - rep.failed_at).total_seconds()))
    for cause in plan.new_incidents:
        metrics.INCIDENTS.labels(cause=cause).inc()
    for incident in plan.recovered:
        metrics.observe_recovery(incident)


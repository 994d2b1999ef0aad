"""The reconcile loop: a keyed work queue, a few workers, and one pass per job = read, plan, apply, write
status once, emit events. kopf handlers (handlers.py) only feed it; all decisions are in planner.plan."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import kopf

from ddpjob_operator import metrics
from ddpjob_operator import reconcile as planner
from ddpjob_operator import status as st
from ddpjob_operator.kube import Kube, NamespaceTerminating, Rejected, adopt
from ddpjob_operator.names import LABEL_REPLICA_TYPE, TYPE_RENDEZVOUS
from ddpjob_operator.observed import PodView, truncate
from ddpjob_operator.workqueue import WorkQueue

Key = tuple[str, str]
log = logging.getLogger("ddpjob.controller")

#: How long a pod we created may be missing from the watch-fed index before we stop assuming it exists.
EXPECTATION_TTL = 30.0
#: Concurrent reconcile passes (each is mostly waiting on the API server).
WORKERS = 16


@dataclasses.dataclass
class JobMemory:
    """What the operator remembers about one job between passes (all of it rebuildable after a restart)."""

    body: dict[str, Any]
    resource_version: int = 0
    restarts_floor: int = 0
    ensured_uid: str = ""
    expected: dict[str, tuple[PodView, float]] = dataclasses.field(default_factory=dict)
    gone_uids: set[str] = dataclasses.field(default_factory=set)
    errors: int = 0


def _first_start(old: Mapping[str, Any]) -> bool:
    """True until the job has run once: never Running, Restarting or Suspended before."""
    seen = (st.RUNNING, st.RESTARTING, st.SUSPENDED)
    return (
        old.get("state") in (None, st.CREATED)
        and all(st.get_condition(old, c) is None or (c == st.RUNNING and not st.condition_true(old, c)) for c in seen)
        and not old.get("restarts")
    )


def _rv(body: Mapping[str, Any]) -> int:
    try:
        return int((body.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


class Controller:
    """Owns the job cache, the queue and the workers of one operator process."""

    def __init__(self) -> None:
        self.jobs: dict[Key, JobMemory] = {}
        self.queue: WorkQueue[Key] = WorkQueue()
        self._states: dict[Key, str] = {}
        self.pods: Mapping[Key, Iterable[PodView]] = {}
        self.kube: Kube | None = None
        self._workers: list[asyncio.Task[None]] = []

    def start(self, kube: Kube, pods_index: Mapping[Key, Iterable[PodView]]) -> None:
        """Start the workers (once), inside a kopf handler's context so kopf.event() can post Events."""
        self.pods = pods_index
        if self._workers:
            return
        self.kube = kube
        self._workers = [asyncio.create_task(self._work(), name=f"ddpjob-worker-{i}") for i in range(WORKERS)]

    async def stop(self) -> None:
        """Cancel the workers (operator shutdown)."""
        self.queue.close()
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []

    def job_seen(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """Record the latest body of a DDPJob from its watch stream and enqueue a pass."""
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if event_type == "DELETED":
            self.jobs.pop(key, None)
            self.queue.forget(key)
            self._set_state(key, None)
            return
        mem = self.jobs.get(key)
        rv = _rv(body)
        if mem is None or mem.body["metadata"].get("uid") != meta.get("uid"):
            self.jobs[key] = JobMemory(body=dict(body), resource_version=rv)
        elif rv >= mem.resource_version:  # never go back to a body older than our own status write
            mem.body, mem.resource_version = dict(body), rv
        self.queue.add(key)

    def pod_seen(self, key: Key) -> None:
        """A pod of the job changed: enqueue a pass."""
        if key in self.jobs:
            self.queue.add(key)

    async def _work(self) -> None:
        while True:
            key = await self.queue.get()
            try:
                await self.reconcile(key)
            except NamespaceTerminating:
                log.info("job=%s/%s namespace is terminating; not recreating children", *key)
            except kopf.TemporaryError as err:
                self._retry(key, err.delay or 1.0, "temporary", err)
            except Exception as err:
                self._retry(key, None, "unexpected", err)
            finally:
                self.queue.done(key)

    def _retry(self, key: Key, delay: float | None, kind: str, err: BaseException) -> None:
        metrics.RECONCILE_ERRORS.labels(kind=kind).inc()
        mem = self.jobs.get(key)
        if mem is None:
            return
        mem.errors += 1
        backoff = delay if delay is not None else min(60.0, 0.5 * 2**mem.errors)
        log.warning(
            "job=%s/%s reconcile failed (%s), retrying in %.1fs: %s",
            *key,
            kind,
            backoff,
            err,
            exc_info=kind == "unexpected",
        )
        self.queue.add_after(key, backoff)

    def observed_pods(self, key: Key, mem: JobMemory, now: float) -> list[PodView]:
        """Index pods, plus pods we created that the watch has not delivered yet, minus pods we force-deleted."""
        indexed = [p for p in self.pods.get(key, ()) if p.uid not in mem.gone_uids]
        by_name = {p.name: p for p in indexed}
        for name, (view, at) in list(mem.expected.items()):
            seen = by_name.get(name)
            if (seen is not None and seen.uid == view.uid) or now - at > EXPECTATION_TTL:
                del mem.expected[name]
            elif seen is None:
                indexed.append(view)
        live_uids = {p.uid for p in self.pods.get(key, ())}
        mem.gone_uids &= live_uids
        return indexed

    async def reconcile(self, key: Key) -> None:
        """One pass for one job."""
        mem = self.jobs.get(key)
        if mem is None or self.kube is None:
            return
        body = mem.body
        if (body.get("metadata") or {}).get("deletionTimestamp"):
            return  # garbage collection removes the children
        t0 = time.monotonic()
        metrics.RECONCILES.inc()
        now = datetime.now(UTC)
        pods = self.observed_pods(key, mem, t0)
        node_ready = await self._nodes_of_stuck_pods(body, pods, now)
        plan = planner.plan(
            body, planner.Observed(pods=pods, node_ready=node_ready, restarts_floor=mem.restarts_floor), now
        )
        try:
            if plan.job is not None:  # None: invalid spec, nothing to create or delete
                await self._apply(key, mem, plan)
        except Rejected as err:
            plan = self._rejected_plan(body, plan, err, now)
        if plan.create_pods or plan.delete_pods or plan.patch:
            log.info(
                "job=%s/%s state=%s created=%s deleted=%s status=%s",
                *key,
                plan.status.get("state"),
                [p["metadata"]["name"] for p in plan.create_pods],
                [f"{d.name}({d.reason})" for d in plan.delete_pods],
                sorted(plan.patch),
            )
        if plan.patch:
            fresh = await self.kube.patch_status(key[0], key[1], plan.patch)
            if fresh and _rv(fresh) >= mem.resource_version:
                mem.body, mem.resource_version = fresh, _rv(fresh)
            if plan.status.get("state") == st.RUNNING and _first_start(body.get("status") or {}):
                self._observe_time_to_running(body, now)
        mem.restarts_floor = max(mem.restarts_floor, int(plan.status.get("restarts") or 0))
        for event in plan.events:
            poster = kopf.warn if event.type == "Warning" else kopf.info
            poster(cast(kopf.Body, body), reason=event.reason, message=truncate(event.message))
        if plan.delete_job and plan.job is not None:
            await self.kube.delete_job(key[0], key[1], plan.job.uid)
        mem.errors = 0
        if plan.requeue_after is not None:
            self.queue.add_after(key, plan.requeue_after + 0.2)
        metrics.RECONCILE_DURATION.observe(time.monotonic() - t0)
        self._set_state(key, str(plan.status.get("state") or st.CREATED))

    async def _apply(self, key: Key, mem: JobMemory, plan: planner.Plan) -> None:
        assert self.kube is not None and plan.job is not None
        body = mem.body
        uid = plan.job.uid
        if plan.ensure and mem.ensured_uid != uid:
            # Independent objects: created concurrently; RBAC and the Service exist before any pod starts.
            await asyncio.gather(*(self.kube.create(self._owned(obj, plan, body)) for obj in plan.ensure))
            mem.ensured_uid = uid
        for d in plan.delete_pods:  # before creates: a replacement reuses the deleted pod's name
            if await self.kube.delete_pod(key[0], d.name, d.uid, force=d.force) and d.force:
                mem.gone_uids.add(d.uid)
        results = await asyncio.gather(*(self.kube.create(adopt(pod, body)) for pod in plan.create_pods))
        for pod, created in zip(plan.create_pods, results, strict=True):
            if created is None:
                self.queue.add_after(key, planner.RETRY_SOON_SECONDS)  # name still taken: look again soon
                continue
            view = PodView.from_pod(created)
            mem.expected[view.name] = (view, time.monotonic())
            kind = "rendezvous" if pod["metadata"]["labels"].get(LABEL_REPLICA_TYPE) == TYPE_RENDEZVOUS else "worker"
            metrics.PODS_CREATED.labels(type=kind).inc()
        now = datetime.now(UTC)
        for rep in plan.replacements:
            metrics.PODS_REPLACED.labels(exit_class=metrics.exit_class(rep.exit_code)).inc()
            if rep.failed_at is not None:
                metrics.FAILURE_TO_REPLACEMENT.observe(max(0.0, (now - rep.failed_at).total_seconds()))

    @staticmethod
    def _owned(obj: dict[str, Any], plan: planner.Plan, body: Mapping[str, Any]) -> dict[str, Any]:
        """Children get a controller ownerReference, except a PVC the user asked to keep after deletion."""
        assert plan.job is not None
        if obj["kind"] == "PersistentVolumeClaim" and plan.job.spec.checkpoint.retain_on_delete:
            return obj
        return adopt(obj, body)

    def _rejected_plan(self, body: Mapping[str, Any], plan: planner.Plan, err: Rejected, now: datetime) -> planner.Plan:
        """The API server refused a child built from the template: fail the job with its explanation."""
        old = body.get("status") or {}
        reason = "InvalidPodTemplate" if err.kind == "Pod" else "ChildRejected"
        outcome = st.Outcome(state=st.FAILED, reason=reason, message=truncate(f"the API server rejected {err}"))
        counts = st.Counts(
            desired=plan.job.spec.replicas if plan.job else 0,
            restarts=int(plan.status.get("restarts") or 0),
            start_time=plan.status.get("startTime"),
            completion_time=plan.status.get("completionTime") or now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        new = st.compute_status(
            old,
            outcome=outcome,
            workers=[],
            counts=counts,
            generation=int(body["metadata"].get("generation") or 0),
            now=now,
        )
        return planner.Plan(
            job=plan.job, status=new, patch=st.status_patch(old, new), events=st.transition_events(old, new)
        )

    async def _nodes_of_stuck_pods(
        self, body: Mapping[str, Any], pods: list[PodView], now: datetime
    ) -> dict[str, bool]:
        """Readiness of the nodes of pods Terminating for longer than the threshold (a rare, cheap read)."""
        assert self.kube is not None
        policy = (body.get("spec") or {}).get("runPolicy") or {}
        threshold = timedelta(seconds=int(policy.get("terminatingNodeTimeoutSeconds", 300)))
        nodes = {
            p.node_name
            for p in pods
            if p.node_name and p.deletion_timestamp and now - p.deletion_timestamp >= threshold
        }
        return {n: await self.kube.node_ready(n) for n in nodes}

    def _observe_time_to_running(self, body: Mapping[str, Any], now: datetime) -> None:
        created = (body.get("metadata") or {}).get("creationTimestamp")
        if created:
            start = datetime.fromisoformat(str(created).replace("Z", "+00:00"))
            metrics.TIME_TO_ALL_RUNNING.observe(max(0.0, (now - start).total_seconds()))

    def _set_state(self, key: Key, state: str | None) -> None:
        """Keep the jobs-by-state gauge current in O(1) per pass."""
        old = self._states.pop(key, None)
        if state is not None:
            self._states[key] = state
        if old != state:
            metrics.move_job_state(old, state)

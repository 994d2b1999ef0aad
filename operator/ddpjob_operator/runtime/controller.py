"""The reconcile loop: a keyed work queue, a few workers, and one pass per job = read, plan, apply, write
status once, emit events. Its streams of DDPJobs and pods (kube/streams.py) and kopf handlers of the rarer kinds
(handlers.py) only feed it (DDPJob bodies, child events into the cache); the periodic resync (resync.py) corrects
what the watches missed; all decisions are in planner.plan."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import logging
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf

from ddpjob_operator.api.formats import truncate
from ddpjob_operator.api.spec import QUEUE_LABEL, InvalidSpec, managed_elsewhere, parse_ddpjob
from ddpjob_operator.kube import streams
from ddpjob_operator.kube.client import Kube, NamespaceTerminating, Rejected
from ddpjob_operator.kube.events import Poster
from ddpjob_operator.kube.identity import WorkerIdentity
from ddpjob_operator.metrics import registry as metrics
from ddpjob_operator.metrics import transitions
from ddpjob_operator.planner import plan as planner
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.observation import PodView
from ddpjob_operator.planner.policies import pods as pod_rules
from ddpjob_operator.planner.policies import report_cadence, routine_progress, status_writes
from ddpjob_operator.planner.policies.rejected import Rejection
from ddpjob_operator.runtime import kueue_sync, resync, status_write
from ddpjob_operator.runtime.apply import answered, apply_children, apply_pods
from ddpjob_operator.runtime.cache import ChildCache, Key
from ddpjob_operator.runtime.isolation import IsolationCheck
from ddpjob_operator.runtime.memory import JobMemory, backoff, kept
from ddpjob_operator.runtime.pod_check import Accepted, check_pods
from ddpjob_operator.runtime.workqueue import WorkQueue

log = logging.getLogger("ddpjob.controller")

#: Concurrent reconcile passes. Each is mostly waiting on the API server: a new job's first pass takes ~1.5 s under
#: a burst (its children, then its pods, then its status, each a round trip of 0.2-0.5 s), so 16 workers queued
#: the 500th of 500 new jobs for 30 s while the API server had room for more (bench/operator_scale.py, 2026-11-25:
#: it served 400 requests/s to a bare client and 230/s to the operator). kube.MAX_IN_FLIGHT still caps the requests.
WORKERS = 64
#: States of jobs whose rank 0 reports its progress, or will once its pods run (report_interval).
_REPORTING = frozenset({st.CREATED, st.RUNNING, st.RESTARTING})


_rv = status_write.resource_version
_older = status_write.older


def _answered(observed: planner.Observed, mem: JobMemory, rejection: Rejection | None = None) -> planner.Observed:
    """What the pass observed, with the API server's answers to its own writes since (refusals, conflicts, a
    rejected child): what a re-plan within the pass plans from."""
    return dataclasses.replace(observed, problems=dict(mem.problems), rejected=rejection,
                               refused_pods=dict(mem.pods_refused),
                               accepted_pods=frozenset(mem.pods_accepted) | (observed.accepted_pods or frozenset()))


class Controller:
    """Owns the job cache, the queue and the workers of one operator process."""

    def __init__(self) -> None:
        self.jobs: dict[Key, JobMemory] = {}
        self.queue: WorkQueue[Key] = WorkQueue()
        metrics.WORKQUEUE_DEPTH.set_function(lambda: len(self.queue))
        metrics.JOB_STATS.source = lambda: [mem.body for mem in self.jobs.values()]
        self.cache = ChildCache()
        self.identity = WorkerIdentity()
        self.accepted = Accepted()  # dry-run verdicts shared by a namespace's jobs (pod_check.py)
        self._states: dict[Key, str] = {}
        self._reporting = 0  # jobs that report their progress or soon will (report_interval)
        self.report_budget = report_cadence.DEFAULT_BUDGET  # ddpjob operator --report-writes-per-second
        self.kube: Kube | None = None
        self.events: Poster | None = None
        self.namespaces: list[str] = []
        self.resync_seconds = resync.DEFAULT_RESYNC_SECONDS
        self.runtime_image = ""  # ddpjob operator --runtime-image; empty: inject.DEFAULT_RUNTIME_IMAGE
        self.isolation = IsolationCheck()  # ddpjob operator --worker-admission-policy (runtime/isolation.py)
        self._workers: list[asyncio.Task[None]] = []
        self._synced: asyncio.Event | None = None
        self._events = 0  # job watch events and status writes so far: marks for the resync (job_seen)
        self.foreign: dict[Key, str] = {}  # jobs another controller manages (spec.managedBy) -> that controller

    def start(self, kube: Kube) -> None:
        """Start the workers, the resync and the streams of DDPJobs and pods (once), inside kopf's context (its
        startup handler, handlers.start) so that the API calls find kopf's credentials."""
        if self._workers:
            return
        self.kube = kube
        self.events = Poster(kube.settings)
        self._synced = asyncio.Event()
        self._workers = [asyncio.create_task(self._work(), name=f"ddpjob-worker-{i}") for i in range(WORKERS)]
        self._workers.append(asyncio.create_task(
            resync.sync_then_resync(kube, self.cache, self, self.namespaces, self.resync_seconds, self._synced),
            name="ddpjob-resync"))
        self._workers.append(asyncio.create_task(
            streams.watch(kube.settings, streams.DDPJOBS, self.namespaces, self.job_seen), name="ddpjob-jobs"))
        self._workers.append(asyncio.create_task(
            streams.watch(kube.settings, streams.PODS, self.namespaces, functools.partial(self.child_seen, "Pod")),
            name="ddpjob-pods"))
        self._workers.append(asyncio.create_task(  # every job says what changed in its next pass
            self.isolation.run(kube, self.resync_seconds, lambda: self.enqueue(list(self.jobs))),
            name="ddpjob-isolation"))

    def post_event(self, body: Mapping[str, Any], type: str, reason: str, message: str) -> None:
        """An Event about the job, posted in the background (kube/events.py)."""
        assert self.events is not None, "start() first"
        self.events.post(body, type, reason, message)

    @property
    def started(self) -> bool:
        """Whether start() runs the workers (until stop())."""
        return bool(self._workers)

    async def stop(self) -> None:
        """Cancel the workers (operator shutdown)."""
        self.queue.close()
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []
        if self.events is not None:
            await self.events.close()

    def mark(self) -> int:
        """Where the jobs' watch events and status writes stand now: a resync takes it before its LIST."""
        return self._events

    def job_seen(self, event_type: str | None, body: Mapping[str, Any], listed_after: int | None = None) -> None:
        """Record the latest body of a DDPJob from its watch stream (or a resync's LIST sent after the mark
        ``listed_after``) and enqueue a pass. A body is never replaced by one older than it (_older), which keeps
        a late event from undoing our own status write."""
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if event_type != "DELETED" and self._managed_elsewhere(key, body):
            return
        if event_type == "DELETED":
            self.foreign.pop(key, None)
            self.jobs.pop(key, None)
            self.cache.forget(key)
            self.queue.forget(key)
            self._set_state(key, None)
            return
        mem = self.jobs.get(key)
        rv = _rv(body)
        if listed_after is None:
            self._events += 1
        periodic = False
        if mem is None or mem.body["metadata"].get("uid") != meta.get("uid"):
            self.jobs[key] = JobMemory(body=kept(body), resource_version=rv, touched=self._events)
        elif listed_after is not None:
            # A LIST item: newer than all that arrived before the LIST was sent, not than what arrived since.
            periodic = rv == mem.resource_version  # nothing the watch missed: the period's pass, after the others
            if mem.touched <= listed_after and not _older(rv, mem.resource_version):
                mem.take(kept(body), rv, self._events)
        elif rv == mem.resource_version and event_type == "MODIFIED":
            # The echo of our own status write, whose answer the pass already kept: nothing new to plan (every
            # change of a child enqueues its own pass). A listing or the resync always plans.
            return
        elif not _older(rv, mem.resource_version):
            routine = mem.passes > 0 and event_type == "MODIFIED" and not routine_progress.needs_pass(mem.body, body)
            mem.take(kept(body), rv, self._events)
            if routine:  # rank 0's routine report: the stall check's timer reads it when due (issue 46)
                metrics.observe_checkpoints((body.get("status") or {}).get("progress") or {}, mem.checkpoints_seen)
                metrics.ROUTINE_PROGRESS.inc()
                return
        self.queue.add(key, periodic=periodic)

    def _managed_elsewhere(self, key: Key, body: Mapping[str, Any]) -> bool:
        """Whether another controller runs this job (spec.managedBy, immutable): then nothing of it is planned,
        created or written here, as batch/v1's Job controller leaves a Job with a managedBy of another. Said once.
        MultiKueue is the exception: on its manager cluster the job's pass makes its Workload, nothing else."""
        manager = managed_elsewhere(body)
        if manager is None:
            return False
        if self.foreign.get(key) != manager:
            log.info("job=%s/%s is managed by %s (spec.managedBy): this operator leaves it alone", *key, manager)
            self.foreign[key] = manager
        return True

    def child_seen(self, kind: str, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A watch event of a child (pod, Service, ...): update the cache and enqueue its job's pass."""
        key = self.cache.apply(kind, event_type, body)
        if key is not None and key in self.jobs:
            self.queue.add(key)

    def enqueue(self, keys: Iterable[Key]) -> None:
        """Enqueue passes of these jobs (those still known)."""
        for key in keys:
            if key in self.jobs:
                self.queue.add(key)

    def identity_lost(self, namespace: str) -> None:
        """A worker identity object of ``namespace`` was deleted: the jobs there create it again."""
        self.identity.forget(namespace)
        self.enqueue([key for key in self.jobs if key[0] == namespace])

    def resynced(self) -> None:
        """After a resync: check the namespaces' worker identity again (someone may have deleted it)."""
        self.identity.forget()

    def forget_unlisted(self, listed: set[Key], mark: int, scope: Iterable[str] | None) -> None:
        """After a LIST of DDPJobs sent after ``mark`` (whose bodies went through ``job_seen``): forget jobs
        deleted while the watch was down (not those a watch event announced after the mark)."""
        namespaces = set(scope) if scope is not None else None
        for key in [k for k in self.foreign if k not in listed and (namespaces is None or k[0] in namespaces)]:
            del self.foreign[key]
        for key, mem in list(self.jobs.items()):
            if key not in listed and mem.touched <= mark and (namespaces is None or key[0] in namespaces):
                log.info("job=%s/%s is gone (resync); forgetting it", *key)
                self.job_seen("DELETED", mem.body)

    async def _work(self) -> None:
        if self._synced is not None:
            await self._synced.wait()
        while True:
            key, waited = await self.queue.get_timed()
            metrics.WORKQUEUE_LATENCY.observe(waited)
            try:
                await self.reconcile(key)
            except NamespaceTerminating:
                log.info("job=%s/%s namespace is terminating; not recreating children", *key)
            except kopf.TemporaryError as err:
                self._retry(key, err.delay or 1.0, metrics.RETRY_TEMPORARY, err)
            except Exception as err:
                self._retry(key, None, metrics.RETRY_UNEXPECTED, err)
            finally:
                self.queue.done(key)

    def _retry(self, key: Key, delay: float | None, kind: str, err: BaseException) -> None:
        metrics.RECONCILE_ERRORS.labels(kind=kind).inc()
        mem = self.jobs.get(key)
        if mem is None:
            return
        mem.errors += 1
        wait = backoff(mem.errors, base=delay or 0.5)
        log.warning(
            "job=%s/%s reconcile failed (%s), retrying in %.1fs: %s",
            *key,
            kind,
            wait,
            err,
            exc_info=kind == "unexpected",
        )
        self.queue.add_after(key, wait)


    async def reconcile(self, key: Key) -> None:
        """One pass for one job: plan, apply, and one status write (re-planned if the API server's answers to
        this pass's creates changed what it must report: a conflict or refusal shows in the same write)."""
        mem = self.jobs.get(key)
        if mem is None or self.kube is None:
            return
        body = mem.body
        if (body.get("metadata") or {}).get("deletionTimestamp"):
            return  # garbage collection removes the children
        t0 = time.monotonic()
        metrics.RECONCILES.inc()
        metrics.observe_checkpoints((body.get("status") or {}).get("progress") or {}, mem.checkpoints_seen)
        now = datetime.now(UTC)
        observed = await self._observe(key, mem, body, t0, now)
        plan = planner.plan(body, observed, now)
        plan, rejection = await self._carry_out(key, mem, body, observed, plan, now)
        spec = body.get("spec")
        # After the pod API's word on its pods (pod_check.py). Copied only when it changed: a comparison costs a
        # tenth of a deep copy, and most passes (pod and progress events) see the same spec.
        if plan.job is not None and plan.invalid is None and spec != mem.last_valid_spec:
            mem.last_valid_spec = copy.deepcopy(spec)
        self._log(key, plan)
        for path, value in plan.unreadable.items():  # once per job: the planner leaves out those said before
            log.warning("job=%s/%s %s=%r is not a time the operator can read: ignored", *key, path, value)
        mem.unreadable_said.update(plan.unreadable)
        mem.routine_since = (mem.routine_since or now) if plan.status_held else None
        if plan.patch:
            seen = _answered(observed, mem, rejection)  # a refused write plans again from the newer job with it
            written = await status_write.write(self.kube, key, _rv(body), plan,
                                               lambda fresh: planner.plan(fresh, seen, now))
            plan, fresh = written.plan, written.body
            if fresh and not _older(_rv(fresh), mem.resource_version):
                self._events += 1
                mem.take(kept(fresh), _rv(fresh), self._events)
            if written.conflict or written.replanned:  # the next pass carries out what the newer body changed
                self.queue.add(key)
            if written.conflict:  # nothing of the refused plans is said or counted
                return
            transitions.observe_written(body, plan.status, now)
        mem.restarts_floor = max(mem.restarts_floor, int(plan.status.get("restarts") or 0))
        mem.incidents_floor = max(mem.incidents_floor, int(plan.status.get("incidentCount") or 0))
        for event in plan.events:
            self.post_event(body, event.type, event.reason, truncate(event.message))
        if plan.delete_job and plan.job is not None:
            await self.kube.delete_job(key[0], key[1], plan.job.uid)
        mem.errors = 0
        mem.passes += 1
        self._schedule(key, mem, plan)
        metrics.RECONCILE_DURATION.observe(time.monotonic() - t0)
        self._set_state(key, str(plan.status.get("state") or st.CREATED))

    async def _observe(self, key: Key, mem: JobMemory, body: Mapping[str, Any], t0: float, now: datetime
                       ) -> planner.Observed:
        """What the planner is given: the job's children as cached, and what this process remembers of it."""
        pods = mem.observed_pods(self.cache.pods(key), t0)
        return planner.Observed(
            pods=pods, children=self.cache.children(key), problems=dict(mem.problems),
            node_ready=await self._node_readiness(body, pods, now), restarts_floor=mem.restarts_floor,
            incidents_floor=mem.incidents_floor, first_pass=mem.passes == 0, routine_since=mem.routine_since,
            deleted=frozenset(mem.deleted_uids),
            routine_wait=status_writes.interval(len(self.queue), WORKERS),
            report_interval=self.report_interval(),
            kueue=await self._kueue_inputs(body, key, mem), last_valid_spec=mem.last_valid_spec,
            runtime_image=self.runtime_image, unreadable_said=frozenset(mem.unreadable_said),
            refused_pods=dict(mem.pods_refused),
            accepted_pods=frozenset(mem.pods_accepted) | self.accepted.of(key),
            worker_isolation=self.isolation.verdict,
        )

    async def _carry_out(self, key: Key, mem: JobMemory, body: Mapping[str, Any], observed: planner.Observed,
                         plan: planner.Plan, now: datetime) -> tuple[planner.Plan, Rejection | None]:
        """Carry the plan out: the children, the dry run of a new spec's pods (pod_check.py), the pods, then Kueue's
        Workload writes. After a step whose answers changed what the pass knows, the planner plans again with them,
        and its plan is taken whole less what was done (apply.answered): the pods it then holds back are never
        created, and the status, the Events and the next pass say what the answers mean. A child rejected as invalid
        fails the job: the planner plans that too (history kept), and its pod deletes (cleanPodPolicy) and Workload
        writes are carried out. Returns the plan and the rejection it was planned with (a re-plan of the status write
        must keep it)."""
        assert self.kube is not None
        rejection: Rejection | None = None

        def replan(rejection: Rejection | None = None) -> planner.Plan:
            return planner.plan(body, _answered(observed, mem, rejection), now)

        try:
            if plan.job is not None and await apply_children(self.kube, key, mem, plan, self.identity):
                plan = answered(replan(), plan, pods=False)
            # A new spec's pods: dry run first.
            if await check_pods(self.kube, key, mem, plan, self.identity, self.accepted):
                plan = answered(replan(), plan, pods=False)
            if plan.job is not None and await apply_pods(self.kube, key, mem, plan, self.identity):
                plan = answered(replan(), plan, pods=True)
        except Rejected as err:
            rejection = Rejection(err.kind, err.name, err.message)
            plan = replan(rejection)
            if plan.job is not None:  # a Failed plan creates nothing: nothing here can be rejected again
                await apply_pods(self.kube, key, mem, plan, self.identity)
        if plan.workload_writes:  # after the pod deletes: an evicted job's quota goes back once none is active
            await kueue_sync.write(self.kube, body, plan.workload_writes, now)
        return plan, rejection

    def _schedule(self, key: Key, mem: JobMemory, plan: planner.Plan) -> None:
        """The next pass: when the plan asked, sooner while a create is refused (with jittered backoff)."""
        delays = [] if plan.requeue_after is None else [plan.requeue_after + 0.2]
        if any(not p.conflict for p in mem.problems.values()):
            mem.refusals += 1
            delays.append(backoff(mem.refusals, base=1.0))
        else:
            mem.refusals = 0
        if mem.name_taken:  # a create found its name still taken by a pod on its way out: look again soon
            mem.name_taken = False
            delays.append(planner.RETRY_SOON_SECONDS)
        if delays:
            self.queue.add_after(key, min(delays))

    @staticmethod
    def _log(key: Key, plan: planner.Plan) -> None:
        for line in plan.losses:
            log.info("job=%s/%s %s", *key, line)
        if plan.create_pods or plan.delete_pods or plan.patch or plan.ensure:
            log.info(
                "job=%s/%s state=%s created=%s deleted=%s ensured=%s status=%s",
                *key,
                plan.status.get("state"),
                [p["metadata"]["name"] for p in plan.create_pods],
                [f"{d.name}({d.reason})" for d in plan.delete_pods],
                [f"{o['kind']}/{o['metadata']['name']}" for o in plan.ensure],
                sorted(plan.patch),
            )

    async def _kueue_inputs(self, body: Mapping[str, Any], key: Key, mem: JobMemory) -> planner.KueueInputs:
        """A queued job's priority class and admitted flavors (kueue_io); nothing for an invalid job."""
        assert self.kube is not None
        if not ((body.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL):
            return planner.KueueInputs()  # most jobs: no second parse of the body on every pass
        try:
            job = parse_ddpjob(body)
        except InvalidSpec:
            return planner.KueueInputs()
        return await kueue_sync.read_inputs(self.kube, job, self.cache.children(key), mem)

    async def _node_readiness(
        self, body: Mapping[str, Any], pods: list[PodView], now: datetime
    ) -> dict[str, bool]:
        """Readiness of the nodes of pods Terminating for longer than the threshold (a rare, cheap read; counted
        from the deletion's request, as policies/stuck.py counts: a node it was not given is NotReady to it), and of
        counted pods their group reported silent (forced where NotReady, else deleted gracefully first)."""
        assert self.kube is not None
        policy = (body.get("spec") or {}).get("runPolicy") or {}
        threshold = timedelta(seconds=int(policy.get("terminatingNodeTimeoutSeconds", 300)))
        nodes = {
            p.node_name
            for p in pods
            if p.node_name and p.deletion_requested and now - p.deletion_requested >= threshold
        } | pod_rules.silent_nodes(pods, body.get("status") or {})
        return {n: await self.kube.node_ready(n) for n in nodes}

    def _set_state(self, key: Key, state: str | None) -> None:
        """Keep the jobs-by-state gauge current in O(1) per pass."""
        old = self._states.pop(key, None)
        if state is not None:
            self._states[key] = state
        if old != state:
            metrics.move_job_state(old, state)
            self._reporting += (state in _REPORTING) - (old in _REPORTING)

    def report_interval(self) -> int | None:
        """The report cadence for the jobs that report or soon will: Running, Restarting, and Created (a burst of
        new jobs sets it before they turn Running, so the Running transition's write carries it; counted by Running
        alone, each doubling rewrote every running job's status: 3 times each while 5,000 jobs started)."""
        return report_cadence.interval(self._reporting, self.report_budget)

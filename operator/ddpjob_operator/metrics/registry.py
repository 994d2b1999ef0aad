"""Prometheus metrics of the operator (prometheus-client). Labels carry only small fixed sets of values
(states, pod types, outcomes), never pod names; the exception is the ddpjob_job_* gauges, a series per existing
DDPJob (it goes with the job): its global step, which `kubectl ddpjob report --prometheus` draws, and the figures the
chart's alerts read to name the job."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ddpjob_operator.metrics import jobstats
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.policies import isolation
from ddpjob_operator.planner.policies.failure import CAUSES
from ddpjob_operator.planner.policies.recovery_clock import PHASES, TOTAL

#: Buckets for durations measured in seconds from pod creation or failure to a running pod.
_LIFECYCLE_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800)

RECONCILES = Counter("ddpjob_reconcile", "Reconcile passes of DDPJobs")
ROUTINE_PROGRESS = Counter("ddpjob_routine_progress_reports",
                           "Routine progress reports of quiet running jobs that needed no reconcile pass")
RECONCILE_ERRORS = Counter("ddpjob_reconcile_errors", "Reconcile passes that failed and were retried", ["kind"])
#: The kinds controller._retry counts: exported at 0 from the start, so a rate over them is 0, not "no data".
RETRY_TEMPORARY, RETRY_UNEXPECTED = "temporary", "unexpected"
RETRY_KINDS = (RETRY_TEMPORARY, RETRY_UNEXPECTED)
RECONCILE_DURATION = Histogram(
    "ddpjob_reconcile_duration_seconds",
    "Wall time of one reconcile pass (read, plan, apply, status write)",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
RESYNC_SECONDS = Histogram("ddpjob_resync_duration_seconds", "Wall time of one periodic resync (every watched kind "
                           "listed)", buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600))
RESYNC_LISTED = Gauge("ddpjob_resync_listed_objects", "Objects the last periodic resync listed; past a period's "
                      "worth (runtime/resync.LISTED_PER_SECOND) the period stretches (runtime/resync.next_wait)")
WORKER_ADMISSION_POLICY = Gauge(
    "ddpjob_worker_admission_policy", "1 for what the operator last found of the chart's worker admission policy "
    "and its binding (present; absent; unknown: not readable; unchecked: no --worker-admission-policy), 0 for the "
    "other states (planner/policies/isolation.py)", ["state"])
LEADER = Gauge("ddpjob_operator_leader", "1 while this replica holds the leader Lease and reconciles (always 1 "
               "without leader election), 0 while it waits as a standby")
JOBS = Gauge("ddpjob_jobs", "DDPJobs known to this operator, by state", ["state"])
PODS_CREATED = Counter("ddpjob_pods_created", "Pods the operator created", ["type"])
API_REQUESTS = Counter("ddpjob_api_requests", "API requests the operator made, each retry counted, by verb, "
                       "resource and HTTP status (0: no answer)", ["verb", "resource", "code"])
PODS_REPLACED = Counter("ddpjob_pods_replaced", "Worker pods replaced after a failure", ["exit_class"])
TIME_TO_ALL_RUNNING = Histogram(
    "ddpjob_time_to_all_running_seconds",
    "Seconds from a DDPJob's creation to all its workers running",
    buckets=_LIFECYCLE_BUCKETS,
)
INCIDENTS = Counter("ddpjob_incidents", "Incidents (one cause, any number of pods) by cause", ["cause"])
FAILURE_TO_REPLACEMENT = Histogram(
    "ddpjob_failure_to_replacement_seconds",
    "Seconds from a worker's failure to the creation of its replacement",
    buckets=_LIFECYCLE_BUCKETS,
)
#: Buckets for a recovery and its phases: the targets are seconds (3 s with a spare, 8 s without).
_RECOVERY_BUCKETS = (0.25, 0.5, 1, 1.5, 2, 3, 5, 8, 13, 20, 30, 60, 120, 300)
RECOVERY = Histogram(
    "ddpjob_recovery_seconds",
    "Seconds from an incident's start to the first training step after it (recoverySeconds without a clock)",
    buckets=_RECOVERY_BUCKETS,
)
RECOVERY_PHASE = Histogram(
    "ddpjob_recovery_phase_seconds",
    "Seconds from an incident's start to each recovery phase (policies/recovery_clock.py PHASES)",
    ["phase"],
    buckets=_RECOVERY_BUCKETS,
)
WORKQUEUE_DEPTH = Gauge("ddpjob_workqueue_depth", "Jobs waiting in the work queue for a reconcile pass")
WORKQUEUE_LATENCY = Histogram(
    "ddpjob_workqueue_latency_seconds", "Seconds a job waited in the work queue before its pass started",
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
API_LATENCY = Histogram(
    "ddpjob_api_request_duration_seconds", "Seconds one API request took (after the client-side rate limit), by "
    "verb and resource", ["verb", "resource"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
#: Checkpoint writes and loads: a small model's take milliseconds, a large one's on a slow volume minutes.
_CHECKPOINT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
CHECKPOINT_SAVE = Histogram(
    "ddpjob_checkpoint_save_seconds", "Seconds a job's rank 0 took to write a checkpoint, as its progress reports "
    "say (status.progress.lastCheckpoint.seconds: each checkpoint a report names, once)", buckets=_CHECKPOINT_BUCKETS,
)
CHECKPOINT_LOAD = Histogram(
    "ddpjob_checkpoint_load_seconds", "Seconds a job's rank 0 took to load its checkpoint when its process group "
    "started, a peer's transfer included (status.progress.start.checkpointLoadSeconds)", buckets=_CHECKPOINT_BUCKETS,
)
#: Every value of status.state (planner/status.py Outcome.state), each exported from the start.
STATES = (st.CREATED, st.QUEUED, st.RUNNING, st.RESTARTING, st.SUSPENDED, st.SUCCEEDED, st.FAILED)


KUEUE_PREEMPTIONS = Counter("ddpjob_kueue_evictions", "Kueue evictions of running DDPJobs (preemption, PodsReady "
                            "timeout, a stopped queue ...), by Kueue's reason", ["reason"])
KUEUE_QUEUED = Histogram(
    "ddpjob_kueue_queued_seconds", "Seconds a DDPJob waited in Kueue (state Queued) before an admission let it start "
    "again: from its creation, or from its eviction", buckets=_LIFECYCLE_BUCKETS,
)


def exit_class(code: int | None) -> str:
    """A bounded label for an exit code: signal, error or unknown."""
    if code is None:
        return "unknown"
    return "signal" if code >= 128 else "error"


def move_job_state(old: str | None, new: str | None) -> None:
    """A job changed state (None: unknown before, or deleted now)."""
    if old in STATES:
        JOBS.labels(state=old).dec()
    if new in STATES:
        JOBS.labels(state=new).inc()


for _state in STATES:  # every state is exported from the start, at 0
    JOBS.labels(state=_state).set(0)
for _kind in RETRY_KINDS:
    RECONCILE_ERRORS.labels(kind=_kind)
for _cause in CAUSES:  # every cause is exported from the start, at 0
    INCIDENTS.labels(cause=_cause)
for _phase in PHASES:
    RECOVERY_PHASE.labels(phase=_phase)


def set_worker_admission_policy(state: str) -> None:
    """What the operator found of the worker admission policy: 1 for that state, 0 for the others."""
    for known in isolation.STATES:
        WORKER_ADMISSION_POLICY.labels(state=known).set(1 if known == state else 0)


set_worker_admission_policy(isolation.UNCHECKED)


#: Longer than any checkpoint or recovery could take: a reported figure above it is junk, not a measurement.
MAX_OBSERVED_SECONDS = 7 * 24 * 3600


def duration(value: object) -> float | None:
    """``value`` as seconds to observe, or None for what a worker-written status may hold but no clock measured:
    not a number (a bool, text), NaN or infinite, negative, or above MAX_OBSERVED_SECONDS."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 <= value <= MAX_OBSERVED_SECONDS else None  # NaN compares False


def observe_recovery(incident: dict[str, object]) -> None:
    """A recovered incident's clock (status.incidents[].phases) into the histograms."""
    phases = incident.get("phases")
    phases = phases if isinstance(phases, dict) else {}
    total = duration(phases.get(TOTAL, incident.get("recoverySeconds")))
    if total is not None:
        RECOVERY.observe(total)
    for phase, seconds in phases.items():
        if phase in PHASES and (value := duration(seconds)) is not None:
            RECOVERY_PHASE.labels(phase=phase).observe(value)


def observe_checkpoints(progress: Mapping[str, Any], seen: dict[str, object]) -> None:
    """The checkpoint write and load a job's progress names into the histograms, each once: ``seen`` (the job's
    memory) keeps which were observed. A load is known by its time: a new group's start keeps the previous
    group's figures until its own load is reported."""
    ckpt = progress.get("lastCheckpoint")
    ckpt = ckpt if isinstance(ckpt, Mapping) else {}
    save, saved = (ckpt.get("step"), ckpt.get("time")), duration(ckpt.get("seconds"))
    if saved is not None and seen.get("save") != save:
        seen["save"] = save
        CHECKPOINT_SAVE.observe(saved)
    start = progress.get("start")
    start = start if isinstance(start, Mapping) else {}
    loaded, took = start.get("checkpointLoadedTime"), duration(start.get("checkpointLoadSeconds"))
    if took is not None and loaded and seen.get("load") != loaded:
        seen["load"] = loaded
        CHECKPOINT_LOAD.observe(took)


def serve(port: int) -> None:
    """Start the /metrics HTTP endpoint on all interfaces (port 0: disabled)."""
    if port:
        start_http_server(port)


#: The labels of the per-job series: the DDPJob's (a scrape's own job and namespace labels are the operator's).
JOB_LABELS = ["ddpjob_namespace", "ddpjob_name"]
#: The per-job series of the alert rules: name, help, the figure (jobstats.JobFigures).
_PER_JOB = (
    ("ddpjob_job_stalled", "1 while a running DDPJob's Stalled condition is True, else 0", "stalled"),
    ("ddpjob_job_last_stall_timestamp_seconds", "When a DDPJob's newest Stalled incident started (Unix time)",
     "last_stall"),
    ("ddpjob_job_incident_budget_used_ratio", "The share of spec.runPolicy.backoffLimit an unfinished DDPJob's "
     "incidents used", "budget_used"),
    ("ddpjob_job_checkpoint_age_seconds", "Seconds since a running DDPJob's last checkpoint (jobs that reported one)",
     "checkpoint_age"),
)


def _per_job(figures: list[jobstats.JobFigures]) -> Iterator[GaugeMetricFamily]:
    for name, text, field in _PER_JOB:
        family = GaugeMetricFamily(name, text, labels=JOB_LABELS)
        for job in figures:
            value = getattr(job, field)
            if value is not None:
                family.add_metric([job.namespace, job.name], value)
        yield family


class JobStatsCollector(Collector):
    """Figures over every known job (jobstats.py), computed when Prometheus scrapes; ``source`` is set by the
    controller (no jobs before)."""

    def __init__(self) -> None:
        self.source: Callable[[], list[Mapping[str, Any]]] = list

    def collect(self) -> Iterator[GaugeMetricFamily]:
        bodies = self.source()
        stats = jobstats.collect(bodies, datetime.now(UTC))
        yield GaugeMetricFamily("ddpjob_jobs_incident_budget_nearly_spent", "Unfinished DDPJobs whose incidents "
                                f"reached {jobstats.BUDGET_WARN_SHARE:.0%} of spec.runPolicy.backoffLimit",
                                value=stats.budget_nearly_spent)
        yield GaugeMetricFamily("ddpjob_jobs_stalled", "Running DDPJobs whose Stalled condition is True",
                                value=stats.stalled)
        yield GaugeMetricFamily("ddpjob_jobs_recovering", "Running DDPJobs with an incident still recovering",
                                value=stats.recovering)
        yield GaugeMetricFamily("ddpjob_checkpoint_age_max_seconds", "Seconds since the last checkpoint of the "
                                "running DDPJob that saved one longest ago (0: none reported)",
                                value=stats.max_checkpoint_age)
        steps = GaugeMetricFamily("ddpjob_job_global_step", "The global step a DDPJob's progress last reported (one "
                                  "series per existing job)", labels=JOB_LABELS)
        for namespace, name, step in jobstats.global_steps(bodies):
            steps.add_metric([namespace, name], step)
        yield steps
        yield from _per_job(jobstats.per_job(bodies, datetime.now(UTC)))


JOB_STATS = JobStatsCollector()
REGISTRY.register(JOB_STATS)

"""What the planner (plan.py) takes and returns: the observation of a job's children and the plan of one pass."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from ddpjob_operator.api.spec import DDPJob, InvalidSpec
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.kueue.admission import KueueInputs, WorkloadWrite
from ddpjob_operator.planner.observation import ChildView, PodView
from ddpjob_operator.planner.policies import isolation, pod_verdicts, status_writes
from ddpjob_operator.planner.policies.children import ChildKey, Problem
from ddpjob_operator.planner.policies.pods import DeletePod, Replacement
from ddpjob_operator.planner.policies.rejected import Rejection

Obj = dict[str, Any]


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
    check_pods: list[Obj] = dataclasses.field(default_factory=list)
    """Pods to dry-run first: no pod of a spec is created before the pod API accepted its dry run (pod_verdicts)."""
    replacements: list[Replacement] = dataclasses.field(default_factory=list)
    annotate_pods: list[tuple[PodView, str]] = dataclasses.field(default_factory=list)
    """Workers to give an in-place restart request (policies/stall_restart), with its text."""
    new_incidents: list[str] = dataclasses.field(default_factory=list)
    """Causes of the incidents opened this pass (for the metric)."""
    losses: list[str] = dataclasses.field(default_factory=list)
    """One log line per loss counted this pass."""
    recovered: list[Obj] = dataclasses.field(default_factory=list)
    """Incidents closed this pass, with their recovery clock (for the metric)."""
    delete_job: bool = False
    events: list[st.Event] = dataclasses.field(default_factory=list)
    requeue_after: float | None = None
    invalid: InvalidSpec | None = None
    workload_writes: list[WorkloadWrite] = dataclasses.field(default_factory=list)
    """Kueue: give an evicted Workload's quota back, or mark it Finished (after the pod deletes)."""
    status_held: bool = False
    """A routine status change waits for a later pass (status_writes)."""
    unreadable: dict[str, str] = dataclasses.field(default_factory=dict)
    """The status.progress times found unreadable this pass and not said before, by path (policies/unreadable.py)."""
    dispatch_only: bool = False
    """A MultiKueue manager's pass (kueue/multikueue.py): its Workload only; no worker identity, pod or status."""

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
    """Pods carrying the job's label, tombstones (``gone``) of pods deleted by someone else included."""
    children: Mapping[ChildKey, ChildView] = dataclasses.field(default_factory=dict)
    problems: Mapping[ChildKey, Problem] = dataclasses.field(default_factory=dict)
    """What the API server answered to the last creates (conflicts, refusals)."""
    node_ready: Mapping[str, bool] = dataclasses.field(default_factory=dict)
    deleted: frozenset[str] = frozenset()
    """UIDs of pods this operator deleted (suspend, Kueue's eviction, a Workload gone): still Terminating when the
    job runs again, they are not losses."""
    restarts_floor: int = 0
    incidents_floor: int = 0
    """Highest counts this operator process has written for the job (guards against stale reads)."""
    first_pass: bool = False
    """The first pass of this operator process over the job, on a fully listed cache: a pod of a running job
    that is not there at all was lost while no operator watched."""
    routine_since: datetime | None = None
    """When a pass of this process first held back a routine status change not written since (None: none)."""
    routine_wait: float = status_writes.ROUTINE_INTERVAL
    """How long a routine status change may wait for the next write (longer while the operator is busy)."""
    report_interval: int | None = None
    """The cadence of routine progress reports for the operator's running jobs (policies/report_cadence.py); None:
    the worker's own 10 s."""
    kueue: KueueInputs = dataclasses.field(default_factory=KueueInputs)
    """A queued job's priority class and admitted flavors, as the controller read them."""
    runtime_image: str = ""
    """The operator's ``--runtime-image``: the injected runtime's and the rendezvous pod's image of every job that
    names none itself (spec.runtime.image)."""
    last_valid_spec: Mapping[str, Any] | None = None
    """The last spec of this job that this operator process accepted: a running job goes on with it after an
    invalid edit (policies/edits.py)."""
    rejected: Rejection | None = None
    """A create of this pass that the API server rejected as invalid: the job fails, its history kept."""
    unreadable_said: frozenset[str] = frozenset()
    """Paths of status.progress times this operator process already said it cannot read (once per job)."""
    refused_pods: Mapping[str, pod_verdicts.Verdict] = dataclasses.field(default_factory=dict)
    """The pod API's verdicts on specs whose dry-run pods it refused as invalid, by pod_verdicts.spec_key."""
    accepted_pods: frozenset[str] | None = None
    """Specs whose dry-run pods the pod API accepted (None: no dry runs, as in the local runner)."""
    worker_isolation: isolation.Verdict | None = None
    """What the operator last found of the worker admission policy (None: not checked yet)."""

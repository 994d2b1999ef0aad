"""The working state of one planner pass (planner/plan.py): the job, what was observed, and the counts and
incidents as this pass changes them; its status is computed from it once, at the end."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ddpjob_operator.api import names
from ddpjob_operator.api.spec import DDPJob
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.kueue import workload as kueue
from ddpjob_operator.planner.observation import PodView
from ddpjob_operator.planner.policies import report_cadence, unwatched
from ddpjob_operator.planner.types import Observed

Obj = dict[str, Any]


@dataclasses.dataclass(kw_only=True)
class Pass:
    """The working state of one pass."""

    job: DDPJob
    old: Mapping[str, Any]
    obs: Observed
    now: datetime
    generation: int
    workers: list[PodView]
    rdzv: list[PodView]
    foreign: list[PodView]
    restarts: int
    count: int
    counted: list[str]
    recent: list[Obj]
    start_time: str | None
    completion_time: str | None = None
    aux: list[st.Aux] = dataclasses.field(default_factory=list)
    placements: dict[str, kueue.Placement] | None = None
    """Kueue's placement of each replica type (an admitted queued job), and its Workload as seen."""
    workload: kueue.WorkloadView | None = None

    def status(self, outcome: st.Outcome) -> Obj:
        counts = st.Counts(
            desired=self.job.spec.replicas, spares=self.job.spec.spares, restarts=self.restarts,
            incident_count=self.count, incidents=tuple(self.recent), counted_failures=tuple(self.counted),
            start_time=self.start_time, completion_time=self.completion_time, selector=names.selector(self.job.name),
            report_interval=report_cadence.for_job(self.obs.report_interval,
                                                   self.job.spec.run_policy.progress_deadline_seconds),
        )
        live = [p for p in self.workers if not p.gone]
        return st.compute_status(self.old, outcome=outcome, workers=live, counts=counts,
                                 generation=self.generation, now=self.now, aux=self.aux)


def begin(job: DDPJob, old: Mapping[str, Any], obs: Observed, now: datetime, generation: int) -> Pass:
    ours = [p for p in obs.pods if p.owner_uid == job.uid]
    workers = [p for p in ours if p.replica_type == names.TYPE_WORKER]
    seen = {p.uid for p in ours}
    counted = [u for u in old.get("countedFailures") or [] if u in seen or unwatched.still_missing(u, job, ours)]
    count = max([int(old.get("incidentCount") or 0), obs.incidents_floor, *(p.incident_generation for p in ours)])
    restarts = max([int(old.get("restarts") or 0), obs.restarts_floor, *(p.generation for p in workers)])
    return Pass(
        job=job, old=old, obs=obs, now=now, generation=generation, workers=workers,
        rdzv=[p for p in ours if p.replica_type == names.TYPE_RENDEZVOUS],
        foreign=[p for p in obs.pods if p.owner_uid != job.uid and not p.gone],
        restarts=restarts, count=count, counted=counted, recent=[dict(i) for i in old.get("incidents") or []],
        start_time=old.get("startTime"), completion_time=old.get("completionTime"),
    )

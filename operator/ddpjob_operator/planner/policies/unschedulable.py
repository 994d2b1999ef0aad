"""Queued: the job waits for the scheduler. None of its pods is bound to a node and the scheduler has said why
(PodScheduled=False, Unschedulable): the cluster has no room for it yet, or, for a gang job, not for the whole
gang. A gang job shows it for all its pods; a job without a gang once part of it is placed is not queued (its
state says how many workers run). The message is the scheduler's own, so `kubectl describe` says what is missing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ddpjob_operator.api import reasons
from ddpjob_operator.planner.observation import PodView


@dataclasses.dataclass(frozen=True, slots=True)
class Queued:
    """The Queued condition this pass."""

    queued: bool
    reason: str
    message: str


def decide(pods: Sequence[PodView], *, gang: bool) -> Queued:
    """Queued while no live pod of the job is bound and the scheduler called at least one Unschedulable."""
    live = [p for p in pods if p.active]
    if any(p.node_name for p in live):
        return Queued(False, reasons.SCHEDULED, "the scheduler has placed the job's pods")
    waiting = sorted((p for p in live if p.waiting.startswith(reasons.UNSCHEDULABLE)), key=lambda p: p.name)
    if not waiting:
        return Queued(False, reasons.NOT_QUEUED, "no pod is waiting for the scheduler")
    first = waiting[0]
    what = "the gang (every pod of spec.scheduling.gang's PodGroup)" if gang else "the job's pods"
    verdict = first.waiting.removeprefix(reasons.UNSCHEDULABLE).lstrip(": ") or "no reason given"
    return Queued(True, reasons.GANG_UNSCHEDULABLE if gang else reasons.UNSCHEDULABLE,
                  f"no node for {what}; {len(waiting)} pod(s) unschedulable, e.g. {first.name}: {verdict}")

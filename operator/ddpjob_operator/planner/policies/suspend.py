"""Suspend (Kueue semantics): a suspended job has no pods, but keeps its PVC, Service and counts."""

from __future__ import annotations

from collections.abc import Sequence

from ddpjob_operator.planner.observation import PodView


def pods_to_delete_on_suspend(pods: Sequence[PodView]) -> list[PodView]:
    """Every pod of the job that is not already going away, the rendezvous pod included."""
    return [p for p in pods if not p.deleting]


def start_time_after_resume(suspended: bool, start_time: str | None, now_text: str) -> str | None:
    """Like a Kubernetes Job: a suspended job has no startTime, and resuming restarts the deadline clock."""
    if suspended:
        return None
    return start_time or now_text

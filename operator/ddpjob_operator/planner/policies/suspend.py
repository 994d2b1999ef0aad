"""Suspend (Kueue semantics): a suspended job has no pods (held.py deletes them), but keeps its PVC, Service and
counts."""

from __future__ import annotations


def start_time_after_resume(suspended: bool, start_time: str | None, now_text: str) -> str | None:
    """Like a Kubernetes Job: a suspended job has no startTime, and resuming restarts the deadline clock."""
    if suspended:
        return None
    return start_time or now_text

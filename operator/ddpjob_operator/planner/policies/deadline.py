"""activeDeadlineSeconds: how long a job may be active (since its last start or resume) before it fails."""

from __future__ import annotations

from datetime import datetime, timedelta


def deadline_at(start_time: datetime | None, active_deadline_seconds: int | None) -> datetime | None:
    """When the running job fails with DeadlineExceeded, or None."""
    if start_time is None or active_deadline_seconds is None:
        return None
    return start_time + timedelta(seconds=active_deadline_seconds)


def deadline_exceeded(start_time: datetime | None, active_deadline_seconds: int | None, now: datetime) -> bool:
    """True when the job has been active for longer than its deadline."""
    at = deadline_at(start_time, active_deadline_seconds)
    return at is not None and now >= at

"""TTL after finished: when may a finished DDPJob be deleted?"""

from __future__ import annotations

from datetime import datetime, timedelta


def ttl_expires_at(completion_time: datetime | None, ttl_seconds: int | None) -> datetime | None:
    """When the finished job is to be deleted, or None (not finished, or no TTL set)."""
    if completion_time is None or ttl_seconds is None:
        return None
    return completion_time + timedelta(seconds=ttl_seconds)


def ttl_expired(completion_time: datetime | None, ttl_seconds: int | None, now: datetime) -> bool:
    """True when the job should be deleted now (its PVC follows spec.checkpoint.retainOnDelete)."""
    at = ttl_expires_at(completion_time, ttl_seconds)
    return at is not None and now >= at

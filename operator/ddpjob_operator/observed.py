"""What the operator keeps of a child pod: a small frozen view (kept in the kopf index, so memory stays flat
with thousands of pods) and the RFC 3339 time helpers the pure modules share."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ddpjob_operator import names
from ddpjob_operator.spec import WORKER_CONTAINER

#: Longest termination message copied into a condition or Event (the kubelet caps it at 4 KiB anyway;
#: a condition is read by people, and Events are truncated at 1 KiB by the API server).
MAX_MESSAGE = 1000


def parse_time(value: str | None) -> datetime | None:
    """Parse a Kubernetes timestamp (``2024-01-02T03:04:05Z``), or None."""
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def format_time(value: datetime) -> str:
    """Format a timestamp the way the API server does (UTC, seconds, ``Z``)."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def truncate(text: str, limit: int = MAX_MESSAGE) -> str:
    """Cut a message to ``limit`` characters, keeping its end (where tracebacks say what went wrong)."""
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-(limit - 3) :]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PodView:
    """The parts of a pod the planner reads."""

    name: str
    uid: str
    replica_type: str
    index: int | None = None
    generation: int = 0
    phase: str = "Pending"
    ready: bool = False
    node_name: str | None = None
    created_at: datetime | None = None
    deletion_timestamp: datetime | None = None
    finished_at: datetime | None = None
    exit_code: int | None = None
    termination_message: str = ""
    reason: str = ""

    @property
    def terminated(self) -> bool:
        """Phase Succeeded or Failed: its containers will not run again."""
        return self.phase in ("Succeeded", "Failed")

    @property
    def deleting(self) -> bool:
        """Has a deletionTimestamp (Terminating)."""
        return self.deletion_timestamp is not None

    @property
    def active(self) -> bool:
        """Pending or Running and not being deleted."""
        return not self.terminated and not self.deleting

    @property
    def running(self) -> bool:
        """Running and not being deleted."""
        return self.phase == "Running" and not self.deleting

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any]) -> PodView:
        """Build the view from a pod as the API server returns it."""
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        status = pod.get("status") or {}
        spec = pod.get("spec") or {}
        raw_index = labels.get(names.LABEL_REPLICA_INDEX)
        raw_gen = labels.get(names.LABEL_RESTART_GENERATION, "0")
        statuses = status.get("containerStatuses") or []
        worker = next((c for c in statuses if c.get("name") == WORKER_CONTAINER), statuses[0] if statuses else {})
        term = (worker.get("state") or {}).get("terminated") or (worker.get("lastState") or {}).get("terminated")
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        return cls(
            name=meta.get("name", ""),
            uid=meta.get("uid", ""),
            replica_type=labels.get(names.LABEL_REPLICA_TYPE, names.TYPE_WORKER),
            index=int(raw_index) if raw_index is not None and str(raw_index).isdigit() else None,
            generation=int(raw_gen) if str(raw_gen).isdigit() else 0,
            phase=status.get("phase") or "Pending",
            ready=ready,
            node_name=spec.get("nodeName"),
            created_at=parse_time(meta.get("creationTimestamp")),
            deletion_timestamp=parse_time(meta.get("deletionTimestamp")),
            finished_at=parse_time(term.get("finishedAt")) if term else None,
            exit_code=int(term["exitCode"]) if term and term.get("exitCode") is not None else None,
            termination_message=truncate(str((term or {}).get("message") or status.get("message") or "")),
            reason=str((term or {}).get("reason") or status.get("reason") or ""),
        )

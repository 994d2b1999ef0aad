"""What the operator keeps of a child: small frozen views (kept in the child cache, so memory stays flat with
thousands of pods) and the RFC 3339 time helpers the pure modules share."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from ddpjob_worker.redact import redact
from ddpjob_worker.restart_request import RESTART_ANNOTATION

from ddpjob_operator.api import names, reasons
from ddpjob_operator.api.formats import count, parse_time, truncate
from ddpjob_operator.api.spec import WORKER_CONTAINER
from ddpjob_operator.planner.kueue.workload import WORKLOAD, WorkloadView


def controller_uid(meta: Mapping[str, Any]) -> str | None:
    """UID of the object's controller (the ownerReference with ``controller: true``), or None."""
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid") or "") or None
    return None


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
    """When a graceful deletion's grace period ends (the API server sets it to the request time plus the grace)."""
    deletion_grace_seconds: int = 0
    finished_at: datetime | None = None
    exit_code: int | None = None
    termination_message: str = ""
    reason: str = ""
    owner_uid: str | None = None
    """UID of the pod's controller: a pod is the job's only if this is the job's UID."""
    incident_generation: int = 0
    """The job's incident count when the operator created the pod (label), a floor under status.incidentCount."""
    started_at: datetime | None = None
    """When the worker container last started running."""
    waiting: str = ""
    """Why a pod that is not running waits: ``Unschedulable: ...``, ``ImagePullBackOff``, ``ContainerCreating``."""
    scheduled_at: datetime | None = None
    """When the pod was bound to a node (its PodScheduled condition turned True)."""
    disruption: str = ""
    """Reason of the pod's DisruptionTarget condition (EvictionByEvictionAPI, DeletionByTaintManager, ...)."""
    gone: bool = False
    """A tombstone: the API server deleted the pod; this is its last known state."""
    resource_version: str = ""
    image: str = ""
    """The worker container's image (messages about an image that cannot run the runtime name it)."""
    restart_request: str = ""
    """Its in-place restart request annotation (ddpjob_worker.restart_request), "" without one."""

    @property
    def terminated(self) -> bool:
        """Phase Succeeded or Failed: its containers will not run again."""
        return self.phase in ("Succeeded", "Failed")

    @property
    def deleting(self) -> bool:
        """Has a deletionTimestamp (Terminating)."""
        return self.deletion_timestamp is not None

    @property
    def deletion_requested(self) -> datetime | None:
        """When someone asked for the deletion (deletionTimestamp minus the grace period)."""
        if self.deletion_timestamp is None:
            return None
        return self.deletion_timestamp - timedelta(seconds=self.deletion_grace_seconds)

    @property
    def active(self) -> bool:
        """Pending or Running and not being deleted."""
        return not self.terminated and not self.deleting and not self.gone

    @property
    def running(self) -> bool:
        """Running and not being deleted."""
        return self.phase == "Running" and not self.deleting and not self.gone

    def as_gone(self, at: datetime) -> PodView:
        """This view as a tombstone, deleted at ``at`` if no deletion time was seen."""
        return dataclasses.replace(self, gone=True, deletion_timestamp=self.deletion_timestamp or at)

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any]) -> PodView:
        """Build the view from a pod as the API server returns it."""
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        status = pod.get("status") or {}
        spec = pod.get("spec") or {}
        raw_index = labels.get(names.LABEL_REPLICA_INDEX)
        statuses = status.get("containerStatuses") or []
        worker = next((c for c in statuses if c.get("name") == WORKER_CONTAINER), statuses[0] if statuses else {})
        state = worker.get("state") or {}
        term = state.get("terminated") or (worker.get("lastState") or {}).get("terminated")
        conditions = status.get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        scheduled: Mapping[str, Any] = next(
            (c for c in conditions if c.get("type") == "PodScheduled" and c.get("status") == "True"), {}
        )
        disruption: Mapping[str, Any] = next(
            (c for c in conditions if c.get("type") == "DisruptionTarget" and c.get("status") == "True"), {}
        )
        return cls(
            name=meta.get("name", ""),
            uid=meta.get("uid", ""),
            replica_type=labels.get(names.LABEL_REPLICA_TYPE, names.TYPE_WORKER),
            index=int(raw_index) if raw_index is not None and str(raw_index).isdigit() else None,
            generation=count(labels.get(names.LABEL_RESTART_GENERATION)),
            phase=status.get("phase") or "Pending",
            ready=ready,
            node_name=spec.get("nodeName"),
            created_at=parse_time(meta.get("creationTimestamp")),
            deletion_timestamp=parse_time(meta.get("deletionTimestamp")),
            deletion_grace_seconds=int(meta.get("deletionGracePeriodSeconds") or 0),
            finished_at=parse_time(term.get("finishedAt")) if term else None,
            exit_code=int(term["exitCode"]) if term and term.get("exitCode") is not None else None,
            # Redacted here, where pod text enters the operator: it is copied into conditions, incidents and Events,
            # which more people may read than the pod (a worker of an older runtime did not redact its own).
            termination_message=truncate(redact(str((term or {}).get("message") or status.get("message") or ""))),
            reason=str(status.get("reason") or (term or {}).get("reason") or ""),
            owner_uid=controller_uid(meta),
            incident_generation=count(labels.get(names.LABEL_INCIDENT_GENERATION)),
            started_at=parse_time((state.get("running") or {}).get("startedAt")),
            waiting=_waiting(status, state),
            scheduled_at=parse_time(scheduled.get("lastTransitionTime")),
            disruption=str(disruption.get("reason") or ""),
            resource_version=str(meta.get("resourceVersion") or ""),
            image=_worker_image(spec),
            restart_request=str((meta.get("annotations") or {}).get(RESTART_ANNOTATION) or ""),
        )


def _worker_image(spec: Mapping[str, Any]) -> str:
    containers = spec.get("containers") or []
    worker = next((c for c in containers if c.get("name") == WORKER_CONTAINER), containers[0] if containers else {})
    return str(worker.get("image") or "")


def _waiting(status: Mapping[str, Any], state: Mapping[str, Any]) -> str:
    """Why a pod is not running yet: the scheduler's verdict, else the container's waiting reason."""
    def said(what: Mapping[str, Any], default: str) -> str:
        # The reason stays whole: the policies read it (Unschedulable, ImagePullBackOff); a long message (a failed
        # pull's is several hundred characters) is cut at its start, keeping the end that says why.
        reason = str(what.get("reason") or default)
        message = redact(str(what.get("message") or "").strip())  # a pull error may name a registry's credentials
        return f"{reason}: {truncate(message, 300 - len(reason) - 2)}" if message else reason

    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return said(cond, "Unscheduled")
    # An init container that cannot start (the injected runtime's image not pulled) leaves the worker container
    # "PodInitializing": the init container's own reason is the one that says what is wrong.
    for init in status.get("initContainerStatuses") or []:
        blocked = (init.get("state") or {}).get("waiting") or {}
        if blocked.get("reason") and blocked.get("reason") != reasons.POD_INITIALIZING:
            return said(blocked, "Waiting")
    waiting = state.get("waiting") or {}
    return said(waiting, "Waiting") if waiting else ""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ChildView:
    """A non-pod child (Service, ServiceAccount, Role, RoleBinding, PVC, NetworkPolicy, PodGroup, Workload) as the
    planner sees it."""

    kind: str
    name: str
    uid: str
    owner_uid: str | None = None
    job_label: str = ""
    deleting: bool = False
    resource_version: str = ""
    workload: WorkloadView | None = None
    """A Kueue Workload's conditions and admission (None for every other kind)."""

    @classmethod
    def from_object(cls, obj: Mapping[str, Any], kind: str) -> ChildView:
        """Build the view from an object of ``kind`` as the API server returns it (LIST items carry no kind)."""
        meta = obj.get("metadata") or {}
        return cls(
            kind=kind,
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            owner_uid=controller_uid(meta),
            job_label=str((meta.get("labels") or {}).get(names.LABEL_JOB_NAME) or ""),
            deleting=bool(meta.get("deletionTimestamp")),
            resource_version=str(meta.get("resourceVersion") or ""),
            workload=WorkloadView.from_object(obj) if kind == WORKLOAD else None,
        )

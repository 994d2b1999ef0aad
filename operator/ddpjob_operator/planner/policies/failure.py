"""Failure classification: which of the job's pods are lost this pass, why, and whether restarting can help.

A *loss* is one pod gone for a reason outside the operator's own plan: a worker that failed, a pod deleted or
evicted by someone else, a pod stuck on a lost node, the rendezvous pod ended. The incident policy
(incidents.py) groups losses into incidents; this module only says what each pod's loss is, in words a user can
act on (the worker's own one-line cause from its termination log, or OOMKilled / Evicted / node lost), never a
log tail with frame addresses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime

from ddpjob_worker import contract
from ddpjob_worker.causes import condense

from ddpjob_operator.api.reasons import (
    EVICTED,
    NODE_LOST,
    OOM_KILLED,
    POD_DELETED,
    POD_EVICTED,
    RENDEZVOUS_LOST,
    STALLED,
    WORKER_FAILED,
)
from ddpjob_operator.api.spec import RunPolicy
from ddpjob_operator.planner.observation import PodView
from ddpjob_operator.planner.policies.restart import ExitAction, restart_policy_for_exit_code

#: Causes: the CamelCase words users see in status.incidents[].cause, Events and metrics (a fixed set; the words are
#: defined in api/reasons.py, since a recovering incident's cause is the Restarting condition's reason).
CAUSES = (WORKER_FAILED, OOM_KILLED, POD_DELETED, POD_EVICTED, NODE_LOST, RENDEZVOUS_LOST, STALLED)

#: Which cause names an incident that several losses share: the one that explains the others (a lost store
#: makes every agent exit 200; a lost node takes all its pods).
CAUSE_PRIORITY = (NODE_LOST, RENDEZVOUS_LOST, STALLED, POD_EVICTED, POD_DELETED, OOM_KILLED, WORKER_FAILED)

#: DisruptionTarget reasons (Kubernetes', set on pods it is about to delete) and what they mean here: they only name
#: the loss's cause, never a condition's reason.
_DISRUPTIONS = {
    "DeletionByTaintManager": (NODE_LOST, "its node became unreachable (taint-based eviction)"),
    "EvictionByEvictionAPI": (POD_EVICTED, "evicted through the Eviction API (e.g. kubectl drain)"),
    "PreemptionByScheduler": (POD_EVICTED, "preempted by the scheduler for a higher-priority pod"),
    "DeletionByPodGC": (NODE_LOST, "deleted by the pod garbage collector (its node is gone)"),
    "TerminationByKubelet": (POD_EVICTED, "terminated by the kubelet (node pressure or shutdown)"),
}

_EXIT_MEANING = {
    contract.EXIT_RENDEZVOUS_LOST: "lost the rendezvous store",
    contract.EXIT_PEER_LOST: "lost a peer",
    contract.EXIT_DNS_UNRESOLVED: "the rendezvous host did not resolve",
    contract.EXIT_BAD_CONTRACT: "broken environment contract",
    contract.EXIT_BAD_IMAGE: "the image cannot run the runtime",
    contract.EXIT_CHECKPOINT_SYNC: "its pods could not agree on the newest checkpoint in time",
    137: "killed (SIGKILL)",
    143: "terminated (SIGTERM)",
}


@dataclasses.dataclass(frozen=True, slots=True)
class Loss:
    """One pod the job lost, and why."""

    pod: str
    uid: str
    index: int | None
    """Worker index; None for the rendezvous pod."""
    cause: str
    at: datetime
    """When it was lost (the container's finish time, the deletion time, or when the operator saw it)."""
    detail: str
    """One readable line: what happened to this pod."""
    exit_code: int | None = None
    permanent: bool = False
    """The program said it is broken (a permanent exit code): restarting cannot help, the job fails."""
    unwatched: bool = False
    """Lost while no operator watched: ``at`` is when it was found missing, not when it was lost."""
    never_ran: bool = False
    """Its container never started (a replacement bound to a node that was already lost, say)."""

    @property
    def consequential(self) -> bool:
        """This pod failed because something else was lost (its store or a peer): the consequence of an incident,
        never the start of one while that incident's window is open."""
        return self.exit_code in (contract.EXIT_RENDEZVOUS_LOST, contract.EXIT_PEER_LOST)


def _exit_text(pod: PodView) -> str:
    if pod.exit_code is None:
        return "no exit code"
    meaning = _EXIT_MEANING.get(pod.exit_code)
    if meaning is None and pod.exit_code > 128:
        meaning = f"signal {pod.exit_code - 128}"
    return f"exit code {pod.exit_code}" + (f" ({meaning})" if meaning else "")


def readable_cause(pod: PodView) -> str:
    """The pod's own account of its end, condensed to one line (never frame addresses or usage dumps)."""
    return condense(pod.termination_message, 300) if pod.termination_message else ""


def _failed_loss(pod: PodView, policy: RunPolicy, now: datetime) -> Loss:
    """A pod in phase Failed: classified by its exit code and the kubelet's reason."""
    at = pod.finished_at or pod.deletion_requested or now
    cause_text = readable_cause(pod)
    if pod.reason == EVICTED:  # the kubelet evicted it (node pressure)
        return Loss(pod.name, pod.uid, pod.index, POD_EVICTED, at, _join("evicted by the kubelet", cause_text))
    if pod.reason in _NODE_GONE:
        return Loss(pod.name, pod.uid, pod.index, NODE_LOST, at, _join(f"node lost ({pod.reason})", cause_text))
    if pod.reason in _START_FAILURES:
        return _start_failure(pod, at)
    permanent = restart_policy_for_exit_code(pod.exit_code, policy) is ExitAction.FAIL
    cause = OOM_KILLED if pod.reason == OOM_KILLED else WORKER_FAILED  # the kernel's OOM kill, in Kubernetes' word
    head = f"{_exit_text(pod)}, OOMKilled" if cause == OOM_KILLED else _exit_text(pod)
    return Loss(pod.name, pod.uid, pod.index, cause, at, _join(head, cause_text), pod.exit_code, permanent)


#: Pod reasons (Kubernetes') of a pod whose node is gone: the node controller's NodeLost, the kubelet's graceful
#: node shutdown (NodeShutdown, Terminated).
_NODE_GONE = (NODE_LOST, "NodeShutdown", "Terminated")
#: Container reasons (Kubernetes') of a process that never started (the runtime could not exec the command).
_START_FAILURES = ("StartError", "ContainerCannotRun")
#: What the runtime says when the command's program is not in the image.
_NOT_FOUND = ("executable file not found", "no such file or directory")


def _start_failure(pod: PodView, at: datetime) -> Loss:
    """A worker whose command could not even be started. A program missing from the image (with the injected
    runtime: the image's python3) is permanent, since every replacement would use the same image; anything else
    (a mount or runtime hiccup) is retried."""
    text = readable_cause(pod)
    missing = any(s in pod.termination_message.lower() for s in _NOT_FOUND)
    head = f"container could not start ({pod.reason})"
    if missing:
        head += (f"; image {pod.image or '(unknown)'} lacks the command's program: with the injected runtime the "
                 "image needs Python and torch on its PATH (docs/worker.md)")
    return Loss(pod.name, pod.uid, pod.index, WORKER_FAILED, at, _join(head, text), pod.exit_code, missing)


def _join(head: str, cause: str) -> str:
    return f"{head}: {cause}" if cause else head


def _deleted_loss(pod: PodView, node_ready: Mapping[str, bool], now: datetime) -> Loss:
    """A pod deleted by someone else (user, drain, taint manager, pod GC), seen Terminating or already gone."""
    at = pod.deletion_requested or now
    if pod.disruption in _DISRUPTIONS:
        cause, text = _DISRUPTIONS[pod.disruption]
    elif pod.node_name and node_ready.get(pod.node_name) is False:
        cause, text = NODE_LOST, f"its node {pod.node_name} is NotReady"
    else:
        cause, text = POD_DELETED, "deleted (not by the operator)"
    return Loss(pod.name, pod.uid, pod.index, cause, at, text, never_ran=pod.started_at is None)


def worker_loss(pod: PodView, policy: RunPolicy, node_ready: Mapping[str, bool], now: datetime) -> Loss | None:
    """The loss a worker pod of this job represents, or None while it is healthy, pending or succeeded."""
    if pod.phase == "Failed":
        return _failed_loss(pod, policy, now)
    if pod.phase == "Succeeded":
        return None
    if pod.deleting or pod.gone:
        return _deleted_loss(pod, node_ready, now)
    return None


def rendezvous_loss(pod: PodView, node_ready: Mapping[str, bool], now: datetime) -> Loss | None:
    """The loss the rendezvous pod represents: ended (evicted, node lost), deleted, or gone."""
    if pod.terminated:
        at = pod.finished_at or now
        return Loss(pod.name, pod.uid, None, RENDEZVOUS_LOST, at, f"rendezvous pod ended ({pod.reason or pod.phase})")
    if pod.deleting or pod.gone:
        base = _deleted_loss(pod, node_ready, now)
        return dataclasses.replace(base, cause=RENDEZVOUS_LOST, detail=f"rendezvous pod {base.detail}")
    return None


def pick_cause(causes: Sequence[str]) -> str:
    """The cause that names an incident made of losses with these causes."""
    return min(causes, key=lambda c: CAUSE_PRIORITY.index(c) if c in CAUSE_PRIORITY else len(CAUSE_PRIORITY))

"""Pods that cannot start: a worker or the rendezvous pod whose image cannot be pulled, whose container cannot be
created, or whose store keeps crashing. Without this the job only waits: the workers for a rendezvous that never
forms (up to its join timeout), the operator for a step (up to the start-up deadline), and nothing names the image.
The kubelet retries by itself and a fixed image or secret lets the pod start, so this is a condition (with a
Warning Event), not a failure."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ddpjob_operator.api import reasons
from ddpjob_operator.planner.observation import PodView

#: Waiting reasons of a container that will not start without a change (an image, a secret, a config) or that
#: crash-loops; ContainerCreating, PodInitializing and the like are the normal way up. Kubernetes' words: the
#: PodsCannotStart condition carries the first blocked pod's as its reason.
BLOCKED_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                   "CreateContainerConfigError", "CreateContainerError", "RunContainerError", "CrashLoopBackOff")


@dataclasses.dataclass(frozen=True, slots=True)
class CannotStart:
    """The PodsCannotStart condition this pass."""

    blocked: bool
    reason: str
    message: str


def decide(pods: Sequence[PodView]) -> CannotStart:
    """True while a live pod of the job waits for one of BLOCKED_REASONS, naming the first such pod."""
    blocked = sorted((p for p in pods if p.active and p.waiting.split(":", 1)[0] in BLOCKED_REASONS),
                     key=lambda p: (p.replica_type != "rendezvous", p.name))
    if not blocked:
        return CannotStart(False, reasons.STARTING, "no pod of the job is blocked from starting")
    first = blocked[0]
    reason, _, said = first.waiting.partition(":")
    what = "the rendezvous store" if first.replica_type == "rendezvous" else f"worker image {first.image}"
    more = f" ({len(blocked) - 1} more pod(s) blocked)" if len(blocked) > 1 else ""
    return CannotStart(True, reason, f"{first.name} cannot start ({what}): {reason}: {said.strip()}{more}; the "
                                     "kubelet keeps retrying; fix the image, its pull secret or the runtime image "
                                     "(spec.runtime.image, the operator's --runtime-image)")

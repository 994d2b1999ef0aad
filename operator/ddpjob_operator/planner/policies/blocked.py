"""Pods held back by the API server's answers to the last creates (a rule of the planner, not of the I/O layer).

No pod is created while the gang's PodGroup or the job's Kueue Workload could not be created (their CRD missing, a
refusal): the gang scheduler would hold every pod of a group it does not know, and Kueue admits none without its
Workload; the pods would only take names and quota. Nor while a name the job needs is taken by an object it does not
control (a create answered 409): a foreign Service or Role would route or authorize its pods (children.py), and a
foreign pod need not carry the job's label that the pod watch selects on. Such a pod's create is tried again (to see
whether it is gone), the other pods wait, and ChildConflict names every such object. Nor while the job's
NetworkPolicy could not be created (spec.networkPolicy: Required, the default): its pods would run with the
rendezvous store, the process group's store and the collectives open to every pod that can reach them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ddpjob_operator.api import reasons
from ddpjob_operator.planner.children.gang import POD_GROUP_KIND
from ddpjob_operator.planner.kueue.workload import WORKLOAD
from ddpjob_operator.planner.policies.children import ChildKey, Problem

#: Children the pods cannot run without: the gang's PodGroup and Kueue's Workload (both of another project's CRD: the
#: operator runs without them, a job that needs one says so in CreateRefused), and the job's NetworkPolicy (a job
#: with spec.networkPolicy: Disabled has none, and an answer about one from before is forgotten: relevant()).
GATING_KINDS = frozenset({POD_GROUP_KIND, WORKLOAD, "NetworkPolicy"})


@dataclasses.dataclass(frozen=True, slots=True)
class Blocked:
    """This pass's verdict on pod creates."""

    held: bool
    """Create no pod this pass, except those in ``retry``."""
    retry: frozenset[str] = frozenset()
    """Pods whose name a foreign pod took, while nothing else holds the job: created again to see whether it is
    gone."""
    conflicts: tuple[str, ...] = ()
    """One ChildConflict line per object that holds a name the job needs."""


def relevant(problems: Mapping[ChildKey, Problem], network_policy: bool) -> dict[ChildKey, Problem]:
    """The answers that concern the job as it is now, a refused NetworkPolicy first and worded as what it does (it
    holds every pod); ``network_policy``: the job wants one (spec.networkPolicy: Required)."""
    policy = [key for key, p in problems.items() if p.kind == "NetworkPolicy"]
    out: dict[ChildKey, Problem] = {}
    for key in policy if network_policy else ():
        p = problems[key]
        out[key] = p if p.conflict else dataclasses.replace(p, reason=reasons.NETWORK_POLICY_REFUSED, message=(
            f"{p.message}; no pod is created until it exists ({p.reason}; spec.networkPolicy: Disabled runs the job "
            "without it, open to every pod that reaches it: docs/api.md, Security)"))
    out.update((key, p) for key, p in problems.items() if key not in policy)
    return out


def decide(problems: Mapping[ChildKey, Problem]) -> Blocked:
    """Whether the answers to the last creates hold the job's pod creates back."""
    conflicts = sorted((p for p in problems.values() if p.conflict), key=lambda p: (p.kind, p.name))
    pods = [p for p in conflicts if p.kind == "Pod"]
    gating = any(p.kind in GATING_KINDS for p in problems.values()) or len(pods) < len(conflicts)
    return Blocked(held=gating or bool(pods), retry=frozenset() if gating else frozenset(p.name for p in pods),
                   conflicts=tuple(p.message for p in conflicts))

"""Pods held back by the API server's answers to the last creates (a rule of the planner, not of the I/O layer).

No pod is created while the gang's PodGroup or the job's Kueue Workload could not be created (their CRD missing, a
refusal): the gang scheduler would hold every pod of a group it does not know, and Kueue admits none without its
Workload; the pods would only take names and quota. Nor while a name the job needs is taken by an object it does not
control (a create answered 409): a foreign Service or Role would route or authorize its pods (children.py), and a
foreign pod need not carry the job's label that the pod watch selects on. Such a pod's create is tried again (to see
whether it is gone), the other pods wait, and ChildConflict names every such object.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ddpjob_operator.planner.children.gang import POD_GROUP_KIND
from ddpjob_operator.planner.kueue.workload import WORKLOAD
from ddpjob_operator.planner.policies.children import ChildKey, Problem

#: Children the pods cannot run without (both of another project's CRD: the operator runs without them, a job that
#: needs one says so in CreateRefused).
GATING_KINDS = frozenset({POD_GROUP_KIND, WORKLOAD})


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


def decide(problems: Mapping[ChildKey, Problem]) -> Blocked:
    """Whether the answers to the last creates hold the job's pod creates back."""
    conflicts = sorted((p for p in problems.values() if p.conflict), key=lambda p: (p.kind, p.name))
    pods = [p for p in conflicts if p.kind == "Pod"]
    gating = any(p.kind in GATING_KINDS for p in problems.values()) or len(pods) < len(conflicts)
    return Blocked(held=gating or bool(pods), retry=frozenset() if gating else frozenset(p.name for p in pods),
                   conflicts=tuple(p.message for p in conflicts))

"""A child the API server rejects as invalid (400/422) fails the job: the spec or its pod template cannot be created
as written, and trying again would only be rejected again. The planner writes that Failed status like any other
(plan._fail): the job's incidents, counts and selector stay."""

from __future__ import annotations

import dataclasses

from ddpjob_operator.api import reasons


@dataclasses.dataclass(frozen=True, slots=True)
class Rejection:
    """The API server's answer to a create of this pass: the object is invalid."""

    kind: str
    name: str
    message: str
    """The API server's explanation."""


def failure(rejection: Rejection) -> tuple[str, str]:
    """The Failed condition's reason and message: the pod template's fault, or another child's."""
    reason = reasons.INVALID_POD_TEMPLATE if rejection.kind == "Pod" else reasons.CHILD_REJECTED
    return reason, f"the API server rejected {rejection.kind} {rejection.name}: {rejection.message}"

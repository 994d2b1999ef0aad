"""Whether a worker can write only its own job's status.progress. Every namespace's workers share one ServiceAccount
whose Role may patch the status of every DDPJob there; the chart's ValidatingAdmissionPolicy (and its binding)
narrows that to the worker's own job and to progress. Without it (Kubernetes before 1.30, `helm template` without
the API, the chart value off, either object deleted) user code in one job's worker can write another job's status:
forge its outcome, its incidents, or ``lostPeers`` that make the operator delete that job's pods. The operator
checks both objects at start and on every resync (runtime/isolation.py) and says what it found on every job it
runs (condition StatusUnprotected and its Event), in ddpjob_worker_admission_policy and in its log. Pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ddpjob_operator.api import reasons
from ddpjob_operator.planner import status as st

#: States of ddpjob_worker_admission_policy{state}.
PRESENT, ABSENT, UNKNOWN, UNCHECKED = "present", "absent", "unknown", "unchecked"
STATES = (PRESENT, ABSENT, UNKNOWN, UNCHECKED)
_FIX = ("install the chart on Kubernetes 1.30 or later with rbac.workerAdmissionPolicy=true (docs/api.md, "
        "Security); until then user code in any worker pod of this namespace can rewrite this job's status")


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """What the operator found of the worker admission policy."""

    state: str
    message: str


def judge(name: str, policy: Mapping[str, Any] | None, binding: Mapping[str, Any] | None,
          error: str = "") -> Verdict:
    """The verdict on ValidatingAdmissionPolicy ``name`` and its binding of the same name (None: not found, or
    the API is not served); ``error``: why they could not be read."""
    if not name:
        return Verdict(UNCHECKED, "the operator was started without --worker-admission-policy")
    if error:
        return Verdict(UNKNOWN, f"the operator cannot read ValidatingAdmissionPolicy {name} or its binding: {error}")
    if policy is None:
        return Verdict(ABSENT, f"ValidatingAdmissionPolicy {name} does not exist (or the API server does not serve "
                               "admissionregistration.k8s.io/v1: Kubernetes before 1.30)")
    spec = (binding or {}).get("spec") or {}
    if binding is None or spec.get("policyName") != name or "Deny" not in (spec.get("validationActions") or []):
        return Verdict(ABSENT, f"ValidatingAdmissionPolicy {name} is not in force: no binding {name} that names it "
                               "with validationActions [Deny]")
    return Verdict(PRESENT, f"ValidatingAdmissionPolicy {name} and its binding hold each worker to its own job's "
                            "status.progress")


def condition(verdict: Verdict | None) -> list[st.Aux]:
    """The job's StatusUnprotected condition: True while the policy is not known to be in force (shown from the
    start), False once it is; none when the operator does not check it."""
    if verdict is None or verdict.state == UNCHECKED:
        return []
    if verdict.state == PRESENT:
        return [st.Aux(st.STATUS_UNPROTECTED, False, reasons.ADMISSION_POLICY_IN_FORCE, verdict.message)]
    reason = reasons.ADMISSION_POLICY_MISSING if verdict.state == ABSENT else reasons.ADMISSION_POLICY_UNVERIFIED
    return [st.Aux(st.STATUS_UNPROTECTED, True, reason, f"{verdict.message}: {_FIX}")]

"""What a 403 on create means, and its fix. A 403 is RBAC only when it names an identity and a verb (``User "..."
cannot create resource "pods"``); the API server's admission plugins answer 403 too (a missing PriorityClass, an
exhausted ResourceQuota, Pod Security, a LimitRange, the ServiceAccount plugin, a webhook, a
ValidatingAdmissionPolicy), and granting the operator more would fix none of them. Each is named with the fix that
fits it; a 403 nobody here recognises is an admission plugin's, quoted whole."""

from __future__ import annotations

import re

from ddpjob_worker.redact import redact

from ddpjob_operator.api import reasons
from ddpjob_operator.planner.policies.children import Problem

#: RBAC's denial: the authorizer names the user and the verb it may not use.
_RBAC = re.compile(r'\bUser "[^"]*" cannot [a-z]+ resource\b')
_LIMIT_RANGE = re.compile(r"\b(?:maximum|minimum) [\w-]+ usage per (?:Container|Pod|PersistentVolumeClaim)\b"
                          r"|\bmax limit to request ratio per (?:Container|Pod)\b")

_PRIORITY_HINT = ("create that PriorityClass (kubectl get priorityclasses lists those that exist) or fix "
                  "priorityClassName in the worker template (spec.rendezvous.priorityClassName for the rendezvous pod)")
_QUOTA_FIELDS_HINT = ("set the resources the namespace's ResourceQuota names in the worker template's containers "
                      "(spec.rendezvous.resources for the rendezvous pod)")
_LIMIT_RANGE_HINT = ("fit the containers' requests and limits into the namespace's LimitRange (kubectl describe "
                     "limitrange), in the worker template or spec.rendezvous.resources")
_ACCOUNT_HINT = ("the pod's ServiceAccount does not exist: the operator creates the namespace's ddpjob-worker again; "
                 "a serviceAccountName of the template must name an existing one")
_ADMISSION_HINT = ("an admission check of the cluster refused it (named in the message): change what it names, or "
                   "ask whoever runs that check; more RBAC for the operator would not help")
_RBAC_HINT = "grant the operator's ServiceAccount the permission (chart RBAC)"


def classify(message: str) -> tuple[str, str]:
    """The reason and the fix of a 403's message (the API server's own words)."""
    if "admission webhook" in message and "denied the request" in message:
        return reasons.ADMISSION_DENIED, _ADMISSION_HINT
    if "ValidatingAdmissionPolicy" in message and "denied request" in message:
        return reasons.ADMISSION_DENIED, _ADMISSION_HINT
    if _RBAC.search(message):
        return reasons.FORBIDDEN, _RBAC_HINT
    if "violates PodSecurity" in message:
        return reasons.POD_SECURITY, "make the pod template meet the namespace's Pod Security level"
    if "no PriorityClass with name" in message:
        return reasons.PRIORITY_CLASS_NOT_FOUND, _PRIORITY_HINT
    if "exceeded quota" in message:
        return reasons.QUOTA_EXCEEDED, "raise the namespace's ResourceQuota or lower the job's requests"
    if "failed quota" in message and "must specify" in message:
        # A quota that counts limits.cpu (say) refuses any pod without one: not a permission, a missing field.
        return reasons.QUOTA_NEEDS_RESOURCES, _QUOTA_FIELDS_HINT
    if _LIMIT_RANGE.search(message):
        return reasons.LIMIT_RANGE_VIOLATED, _LIMIT_RANGE_HINT
    if "error looking up service account" in message:
        return reasons.SERVICE_ACCOUNT_MISSING, _ACCOUNT_HINT
    return reasons.ADMISSION_DENIED, _ADMISSION_HINT


def refusal(kind: str, name: str, message: str) -> Problem:
    """A 403 on create, with a reason users can act on (PodSecurity names the fields to change). The message is
    redacted: an admission webhook's denial may quote the object it refused (an env value, a token)."""
    message = redact(message)
    reason, hint = classify(message)
    return Problem(kind=kind, name=name, conflict=False, reason=reason, message=f"{message} (fix: {hint})")

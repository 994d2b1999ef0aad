"""The pod API's verdict on a spec's pods, before any exists. The template is free-form in the CRD (a schema of the
whole PodSpec would be most of the CRD's size and would lag the cluster's own pod API), so the operator creates the
first worker pod and the rendezvous pod of each new spec as a server-side dry run with strict field validation
(runtime/pod_check.py): a typo such as ``resource:`` for ``resources:``, which the pod API would drop with a
warning, and whatever else the pod API or its admission refuses, is known before a pod runs. No pod of a spec is
created before its dry run was accepted (to_check: the plan asks for the dry run instead, and the pass plans again
with the answer). An invalid one (400/422) makes the spec invalid like a schema error: ``InvalidSpec`` naming the
template's field (a job that never started fails; an edit of a running job is ``SpecRejected`` and the job goes on
with the last valid spec: edits.py); a refused one (403: a missing PriorityClass, a quota) is the job's
``CreateRefused`` with its cause, and the dry run is tried again with backoff. Pure: the runtime keeps the verdicts
by spec_key and passes them in."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ddpjob_operator.api import names
from ddpjob_operator.api.spec import DDPJob, InvalidSpec

#: A field path in the pod API's words: ``spec.containers[0].resource``, ``metadata.labels``.
_PATH = re.compile(r"(?<![\w.])(spec|metadata)((?:\.[A-Za-z0-9_-]+|\[\d+\])+)")
_UNKNOWN = re.compile(r'unknown field "([^"]+)"')
_INIT = re.compile(r"^\.initContainers\[(\d+)\]")
#: Rendezvous pod fields and where the spec sets them.
_RDZV = {".nodeSelector": "spec.rendezvous.nodeSelector", ".tolerations": "spec.rendezvous.tolerations",
         ".affinity": "spec.rendezvous.affinity", ".priorityClassName": "spec.rendezvous.priorityClassName",
         ".containers[0].resources": "spec.rendezvous.resources",
         ".imagePullSecrets": "spec.template.spec.imagePullSecrets",
         ".securityContext": "spec.template.spec.securityContext"}


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """Why the pod API refuses a pod built from the spec, in the spec's own terms."""

    field: str
    message: str


def spec_key(job: DDPJob) -> str:
    """What a verdict is about: the template and the rendezvous pod's settings (the schema checks the rest)."""
    text = json.dumps([job.spec.template, job.spec.rendezvous.model_dump(mode="json"), job.spec.runtime.mode],
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _spec_path(root: str, rest: str, *, rendezvous: bool, injected: bool) -> str:
    """A path of the built pod as the spec names it."""
    if root == "metadata":
        return f"spec.template.metadata{rest}" if not rendezvous else f"the rendezvous pod's metadata{rest}"
    if rendezvous:
        for prefix, where in _RDZV.items():
            if rest.startswith(prefix):
                return where + rest[len(prefix):]
        return f"the rendezvous pod's spec{rest}"
    found = _INIT.match(rest)
    if injected and found:  # the operator's runtime init container comes first
        index = int(found[1]) - 1
        return f"spec.template.spec.initContainers[{index}]{rest[found.end():]}" if index >= 0 else "spec.runtime"
    return f"spec.template.spec{rest}"


def explain(message: str, *, rendezvous: bool, injected: bool) -> Verdict:
    """The pod API's refusal (its 400 or 422 message) of a worker pod or the rendezvous pod, naming the spec's
    fields: ``spec.template.spec.containers[0].resource: unknown field``."""
    def named(m: re.Match[str]) -> str:
        return _spec_path(m[1], m[2], rendezvous=rendezvous, injected=injected)

    unknown = [_PATH.sub(named, u) for u in _UNKNOWN.findall(message)]
    if unknown:
        more = f"; also unknown: {', '.join(unknown[1:])}" if len(unknown) > 1 else ""
        return Verdict(unknown[0], "unknown field (the pod API has no such field: check its spelling, e.g. "
                                   f"kubectl explain pod.spec.containers){more}")
    said = _PATH.sub(named, message.split(" is invalid: ", 1)[-1]).strip()
    first = _PATH.search(message)
    field = named(first) if first else ("spec.rendezvous" if rendezvous else "spec.template")
    detail = said[len(field):].lstrip("]:[ ") if said.startswith(field) else said
    return Verdict(field, f"refused by the pod API: {detail}")


def check(job: DDPJob, verdicts: Mapping[str, Verdict]) -> None:
    """Raise InvalidSpec when the pod API refused a pod built from this very spec."""
    verdict = verdicts.get(spec_key(job))
    if verdict is not None:
        raise InvalidSpec(verdict.field, verdict.message)


def to_check(job: DDPJob, creates: Sequence[dict[str, Any]], accepted: Collection[str] | None) -> list[dict[str, Any]]:
    """The pods to dry-run before any pod of this spec is created: the first of each kind among ``creates`` (the
    rendezvous pod, a worker); none once the spec's dry run was accepted, or where nothing is checked (None: the
    local runner, which has no API server)."""
    if accepted is None or not creates or spec_key(job) in accepted:
        return []
    first: dict[bool, dict[str, Any]] = {}
    for pod in creates:
        first.setdefault(pod["metadata"]["labels"].get(names.LABEL_REPLICA_TYPE) == names.TYPE_RENDEZVOUS, pod)
    return list(first.values())

"""The pod API's word on a spec before any of its pods exists (planner/policies/pod_verdicts.py says why and when):
the pods the plan asks to check (the first worker pod and the rendezvous pod of a spec not yet accepted) are sent
as a server-side dry run with strict field validation; nothing is stored. One request per pod kind and spec change.
Decides nothing: it records what the API server said, and the planner plans again with it."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from ddpjob_operator.api.names import LABEL_REPLICA_TYPE, TYPE_RENDEZVOUS
from ddpjob_operator.kube.client import Kube, Rejected, adopt
from ddpjob_operator.kube.identity import WorkerIdentity
from ddpjob_operator.planner import plan as planner
from ddpjob_operator.planner.policies import children, pod_verdicts
from ddpjob_operator.runtime.memory import JobMemory

#: Verdicts kept per job (a few specs: the current one and the edits before it).
KEPT = 8


def _keep(mem: JobMemory, key: str, verdict: pod_verdicts.Verdict | None) -> None:
    if len(mem.pods_accepted) + len(mem.pods_refused) >= KEPT:
        mem.pods_accepted.clear()
        mem.pods_refused.clear()
    if verdict is None:
        mem.pods_accepted.add(key)
    else:
        mem.pods_refused[key] = verdict


async def _dry_run(kube: Kube, body: Mapping[str, Any], pod: dict[str, Any], injected: bool
                   ) -> pod_verdicts.Verdict | children.Problem | None:
    """The pod API's answer to one pod: None (accepted, or an answer that proves nothing: an admission webhook
    without dry-run support, the name taken), the refusal (403), or why it is invalid (400/422)."""
    rendezvous = pod["metadata"]["labels"].get(LABEL_REPLICA_TYPE) == TYPE_RENDEZVOUS
    try:
        result = await kube.create(adopt(copy.deepcopy(pod), body), dry_run=True)
    except Rejected as err:
        if "does not support dry run" in err.message:
            return None  # the real create still has strict field validation
        return pod_verdicts.explain(err.message, rendezvous=rendezvous, injected=injected)
    return result.refused


async def check_pods(kube: Kube, key: tuple[str, str], mem: JobMemory, plan: planner.Plan,
                     identity: WorkerIdentity) -> bool:
    """Dry-run the plan's ``check_pods``; True when there were any (the answers are recorded: the spec accepted or
    its verdict, a refusal as a create's), so that the pass plans again with them."""
    if plan.job is None or not plan.check_pods:
        return False
    spec = pod_verdicts.spec_key(plan.job)
    for pod in plan.check_pods:
        answer = await _dry_run(kube, mem.body, pod, plan.job.spec.runtime.mode == "Inject")
        name = children.key(pod)
        if isinstance(answer, children.Problem):
            mem.problems[name] = answer
            identity.forget(key[0])  # perhaps the namespace's worker ServiceAccount is gone: look again
            return True
        mem.problems.pop(name, None)
        if answer is not None:
            _keep(mem, spec, answer)
            return True
    _keep(mem, spec, None)
    return True

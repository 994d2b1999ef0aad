"""The pod API's word on a spec before any of its pods exists (planner/policies/pod_verdicts.py says why and when):
the pods the plan asks to check (the first worker pod and the rendezvous pod of a spec not yet accepted) are sent
as a server-side dry run with strict field validation; nothing is stored. One request per pod kind and spec change.
Decides nothing: it records what the API server said, and the planner plans again with it.

An accepted spec is accepted for the namespace's other jobs of the same spec whose names have the same length
(Accepted): their pods differ only in the characters of the job's name, so the API server's answer would be the
same; 500 jobs of one template in a namespace made 1,000 dry runs, 2 of each job's 7 pod creates. While one such
job's dry run is in flight, the others of its group wait for its answer instead of sending their own (the first
passes of a burst run at once). A refusal is never shared (each job then sends its own dry run, and tries again
with its own backoff), and the real creates keep strict field validation."""

from __future__ import annotations

import asyncio
import copy
from collections import OrderedDict
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
#: Namespace and name-length groups whose accepted specs are kept for sharing (the least recently used goes first).
GROUPS = 256


class Accepted:
    """Specs whose dry run the API server accepted, by namespace and length of the job's name: at most KEPT specs
    for each of at most GROUPS groups."""

    def __init__(self, groups: int = GROUPS) -> None:
        self._groups: OrderedDict[tuple[str, int], OrderedDict[str, None]] = OrderedDict()
        self._limit = groups
        self._in_flight: dict[tuple[str, int, str], asyncio.Future[bool]] = {}

    def in_flight(self, key: tuple[str, str], spec: str) -> asyncio.Future[bool] | None:
        """The answer (accepted or not) of a dry run of ``spec`` in flight for a job like ``key``, if any."""
        return self._in_flight.get((*_group(key), spec))

    def begin(self, key: tuple[str, str], spec: str) -> asyncio.Future[bool]:
        """A dry run of ``spec`` for the job ``key`` starts: jobs like it wait for the answer it resolves."""
        answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._in_flight[(*_group(key), spec)] = answer
        return answer

    def end(self, key: tuple[str, str], spec: str, answer: asyncio.Future[bool], accepted: bool) -> None:
        """The dry run begun with ``answer`` ended: accepted or not (refused, invalid, failed)."""
        if accepted:
            self.add(key, spec)
        if self._in_flight.get((*_group(key), spec)) is answer:
            del self._in_flight[(*_group(key), spec)]
        if not answer.done():
            answer.set_result(accepted)

    def add(self, key: tuple[str, str], spec: str) -> None:
        """``spec`` was accepted for the job ``key`` (namespace, name)."""
        group = _group(key)
        specs = self._groups.setdefault(group, OrderedDict())
        self._groups.move_to_end(group)
        specs[spec] = None
        specs.move_to_end(spec)
        while len(specs) > KEPT:
            specs.popitem(last=False)
        while len(self._groups) > self._limit:
            self._groups.popitem(last=False)

    def of(self, key: tuple[str, str]) -> frozenset[str]:
        """The specs accepted for a job like ``key`` (its namespace, its name's length)."""
        return frozenset(self._groups.get(_group(key)) or ())


def _group(key: tuple[str, str]) -> tuple[str, int]:
    """The jobs whose pods a dry run speaks for: the job's namespace and the length of its name."""
    return key[0], len(key[1])


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
                     identity: WorkerIdentity, accepted: Accepted) -> bool:
    """Dry-run the plan's ``check_pods``; True when there were any (the answers are recorded: the spec accepted,
    for this job and in ``accepted`` for the namespace's others, or its verdict, a refusal as a create's), so that
    the pass plans again with them. A dry run of the same spec for a job like this one in flight: its answer, if
    it is accepted."""
    if plan.job is None or not plan.check_pods:
        return False
    spec = pod_verdicts.spec_key(plan.job)
    other = accepted.in_flight(key, spec)
    if other is not None and await asyncio.shield(other):
        _keep(mem, spec, None)
        return True
    answer = accepted.begin(key, spec)
    ok = False
    try:
        ok = await _check(kube, key, mem, plan, identity, spec)
    finally:
        accepted.end(key, spec, answer, ok)
    return True


async def _check(kube: Kube, key: tuple[str, str], mem: JobMemory, plan: planner.Plan, identity: WorkerIdentity,
                 spec: str) -> bool:
    """This job's own dry runs; True when every one was accepted."""
    assert plan.job is not None
    for pod in plan.check_pods:
        answer = await _dry_run(kube, mem.body, pod, plan.job.spec.runtime.mode == "Inject")
        name = children.key(pod)
        if isinstance(answer, children.Problem):
            mem.problems[name] = answer
            identity.forget(key[0])  # perhaps the namespace's worker ServiceAccount is gone: look again
            return False
        mem.problems.pop(name, None)
        if answer is not None:
            _keep(mem, spec, answer)
            return False
    _keep(mem, spec, None)
    return True

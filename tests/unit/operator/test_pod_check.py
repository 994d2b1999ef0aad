"""Issue 43 #13 and #14: the pod API's word on a spec before any of its pods exists. The first worker pod and the
rendezvous pod of a new spec are created as a server-side dry run with strict field validation
(runtime/pod_check.py): a typo in the template (``resource:`` for ``resources:``), which the pod API would drop with
a warning, fails a new job as InvalidSpec naming the template's field, and an admission refusal (a missing
PriorityClass) is CreateRefused with its real cause; no pod is created either way."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from ddpjob_operator.api.spec import parse_ddpjob
from ddpjob_operator.kube.client import Created, Rejected, refusal
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.plan import Observed, plan
from ddpjob_operator.planner.policies import pod_verdicts
from ddpjob_operator.planner.policies.pod_verdicts import Verdict, explain

from .factories import at, make_job, running_cluster
from .test_controller import FakeKube, events, run_passes  # noqa: F401 - the fixture

STRICT = 'Pod in version "v1" cannot be handled as a Pod: strict decoding error: unknown field "{}"'
NO_PRIORITY = 'pods "job-rdzv" is forbidden: no PriorityClass with name no-such-priority-class was found'


@pytest.mark.parametrize(("message", "rendezvous", "field", "says"), [
    (STRICT.format("spec.containers[0].resource"), False, "spec.template.spec.containers[0].resource",
     "unknown field"),
    (STRICT.format("spec.containers[0].resource") + ', unknown field "spec.priorityClasName"', False,
     "spec.template.spec.containers[0].resource", "also unknown: spec.template.spec.priorityClasName"),
    (STRICT.format("spec.initContainers[1].imagePullPolice"), False, "spec.template.spec.initContainers[0]"
     ".imagePullPolice", "unknown field"),  # the injected runtime's init container comes first
    ('Pod "job-worker-0" is invalid: spec.containers[0].ports[0].containerPort: Invalid value: 0: must be between 1 '
     'and 65535, inclusive', False, "spec.template.spec.containers[0].ports[0].containerPort", "must be between"),
    ('Pod "job-worker-0" is invalid: [spec.containers[0].image: Required value, spec.volumes[0].name: Required '
     'value]', False, "spec.template.spec.containers[0].image", "spec.template.spec.volumes[0].name: Required"),
    ('Pod "job-rdzv" is invalid: spec.tolerations[0].effect: Unsupported value: "Bogus": supported values: '
     '"NoExecute", "NoSchedule", "PreferNoSchedule"', True, "spec.rendezvous.tolerations[0].effect",
     "Unsupported value"),
    (STRICT.format("spec.affinity.nodeAffinity.requiredDuringScheduling"), True,
     "spec.rendezvous.affinity.nodeAffinity.requiredDuringScheduling", "unknown field"),
])
def test_the_pod_apis_refusal_names_the_specs_field(message: str, rendezvous: bool, field: str, says: str) -> None:
    verdict = explain(message, rendezvous=rendezvous, injected=True)
    assert verdict.field == field and says in verdict.message, verdict


def typo_job() -> dict[str, Any]:
    body = make_job(replicas=2).obj()
    body["spec"]["template"]["spec"]["containers"][0]["resource"] = {"limits": {"cpu": "1"}}
    return body


def test_a_new_job_whose_pods_the_pod_api_refused_fails_naming_the_field() -> None:
    body = typo_job()
    key = pod_verdicts.spec_key(parse_ddpjob(body))
    verdict = explain(STRICT.format("spec.containers[0].resource"), rendezvous=False, injected=True)
    p = plan(body, Observed(refused_pods={key: verdict}), at(0))
    failed = st.get_condition(p.status, st.FAILED) or {}
    assert failed.get("reason") == "InvalidSpec" and p.create_pods == [] and p.ensure == []
    assert str(failed["message"]).startswith("spec.template.spec.containers[0].resource: unknown field")
    assert plan(body, Observed(refused_pods={"another spec": verdict}), at(0)).create_pods, "only this very spec"


def test_a_running_job_edited_into_a_refused_template_goes_on_with_the_last_valid_one() -> None:
    c = running_cluster(replicas=2)
    last_valid = copy.deepcopy(c.jobobj["spec"])
    c.jobobj["spec"]["template"]["spec"]["containers"][0]["resource"] = {"limits": {"cpu": "1"}}
    key = pod_verdicts.spec_key(parse_ddpjob(c.jobobj))
    observed = Observed(pods=c.observed().pods, refused_pods={key: Verdict("spec.template.spec.containers[0].resource",
                                                                           "unknown field")},
                        last_valid_spec=last_valid)
    p = plan(c.jobobj, observed, at(5))
    rejected = st.get_condition(p.status, st.SPEC_REJECTED) or {}
    assert rejected.get("status") == "True" and "containers[0].resource: unknown field" in str(rejected["message"])
    assert not st.condition_true(p.status, st.FAILED) and p.job is not None
    assert "resource" not in p.job.spec.template["spec"]["containers"][0], "the last valid spec"


class DryRunKube(FakeKube):
    """The pod API's dry run answers as a real API server would: strict decoding errors, admission refusals."""

    def __init__(self, job: dict[str, Any], *, invalid: str = "", refused: str = "") -> None:
        super().__init__(job)
        self.invalid, self.refused_with = invalid, refused

    async def create(self, obj: dict[str, Any], *, dry_run: bool = False) -> Created:
        name = obj["metadata"]["name"]
        if not dry_run:
            return await super().create(obj)
        self.calls.append(f"dry-run Pod {name}")
        if self.invalid and name != "job-rdzv":  # the typo is in the workers' template
            raise Rejected("Pod", name, self.invalid)
        if self.refused_with:
            return Created(refused=refusal("Pod", name, self.refused_with))
        return Created(obj=copy.deepcopy(obj))


def test_a_typo_in_the_template_fails_the_job_before_any_pod(events: list[tuple[str, str]]) -> None:  # noqa: F811
    job = typo_job()
    kube = DryRunKube(job, invalid=STRICT.format("spec.containers[0].resource"))
    run_passes(job, kube, passes=2)
    assert not any(call.startswith("create Pod") for call in kube.calls), kube.calls
    assert kube.calls.count("dry-run Pod job-worker-0") == 1, "once: the verdict is kept for the spec"
    failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert failed["message"].startswith("spec.template.spec.containers[0].resource: unknown field")


def test_a_missing_priority_class_holds_every_pod_and_says_so(events: list[tuple[str, str]]) -> None:  # noqa: F811
    job = make_job(replicas=2).obj()
    job["spec"]["template"]["spec"]["priorityClassName"] = "no-such-priority-class"
    kube = DryRunKube(job, refused=NO_PRIORITY)
    c = run_passes(job, kube, passes=2)
    assert not any(call.startswith("create Pod") for call in kube.calls), kube.calls
    refused = next(x for x in job["status"]["conditions"] if x["type"] == "CreateRefused")
    assert (refused["status"], refused["reason"]) == ("True", "PriorityClassNotFound")
    assert "create that PriorityClass" in refused["message"] and "RBAC" not in refused["message"]
    assert not st.condition_true(job["status"], st.FAILED) and c.jobs[("ns", "job")].refusals == 2
    kube.refused_with = ""  # someone created the PriorityClass: the next pass creates the pods
    run_passes(job, kube, passes=1)
    assert sum(call.startswith("create Pod") for call in kube.calls) == 3


def test_an_accepted_spec_is_dry_run_once(events: list[tuple[str, str]]) -> None:  # noqa: F811
    job = make_job(replicas=2).obj()
    kube = DryRunKube(job)
    run_passes(job, kube, passes=3)
    assert [c for c in kube.calls if c.startswith("dry-run")] == ["dry-run Pod job-rdzv", "dry-run Pod job-worker-0"]
    assert sum(c.startswith("create Pod") for c in kube.calls) == 3


@pytest.mark.parametrize(("template_key", "field"), [
    ("metdata", "spec.template.metdata"),
    ("lables", "spec.template.metadata.lables"),
])
def test_a_typo_above_the_pod_spec_is_refused_by_the_model(template_key: str, field: str) -> None:
    """What the operator builds a pod without never reaches the pod API: the model names it."""
    from ddpjob_operator.api.spec import InvalidSpec

    body = make_job().obj()
    if template_key == "lables":
        body["spec"]["template"]["metadata"] = {"lables": {"team": "a"}}
    else:
        body["spec"]["template"][template_key] = {"labels": {"team": "a"}}
    with pytest.raises(InvalidSpec) as err:
        parse_ddpjob(body)
    assert err.value.field == field and "unknown field" in err.value.message


@pytest.mark.parametrize(("accepted", "checks", "creates"), [
    (None, [], ["job-rdzv", "job-worker-0", "job-worker-1"]),  # no dry runs (the local runner)
    ("none", ["job-rdzv", "job-worker-0"], []),  # a new spec: its dry run first, no pod
    ("other", ["job-rdzv", "job-worker-0"], []),  # another spec was accepted, not this one
    ("this", [], ["job-rdzv", "job-worker-0", "job-worker-1"]),
])
def test_no_pod_of_a_spec_is_created_before_its_dry_run_was_accepted(accepted: str | None, checks: list[str],
                                                                       creates: list[str]) -> None:
    body = make_job(replicas=2).obj()
    keys = {None: None, "none": frozenset(), "other": frozenset({"x"}),
            "this": frozenset({pod_verdicts.spec_key(parse_ddpjob(body))})}[accepted]
    p = plan(body, Observed(accepted_pods=keys), at(0))
    assert [o["metadata"]["name"] for o in p.check_pods] == checks
    assert [o["metadata"]["name"] for o in p.create_pods] == creates


def test_a_namespaces_jobs_of_one_spec_share_the_accepted_dry_run(events: list[tuple[str, str]]) -> None:  # noqa: F811
    """Issue 46: 500 jobs of one template in a namespace made 1,000 dry runs. A spec accepted for one job is
    accepted for the namespace's other jobs of that spec whose names have the same length (their pods differ only
    in the name's characters); a longer name, another namespace or another spec is dry-run again."""
    import asyncio

    from ddpjob_operator.runtime import controller as ctl

    def job(name: str, namespace: str = "ns", image: str = "") -> dict[str, Any]:
        body = make_job(name=name, namespace=namespace).obj()
        if image:
            body["spec"]["template"]["spec"]["containers"][0]["image"] = image
        return body

    async def scenario() -> dict[str, list[str]]:
        c = ctl.Controller()
        calls: dict[str, list[str]] = {}
        for body in (job("job"), job("jab"), job("jobs"), job("jab", "other"), job("jib", image="other:1")):
            kube = DryRunKube(body)
            c.kube = kube  # type: ignore[assignment]  # a duck-typed fake of the API layer
            c.job_seen(None, body)
            await c.reconcile((body["metadata"]["namespace"], body["metadata"]["name"]))
            calls[f'{body["metadata"]["namespace"]}/{body["metadata"]["name"]}'] = kube.calls
        c.queue.close()
        return calls

    calls = asyncio.run(scenario())
    dry_runs = {job: sum(c.startswith("dry-run") for c in cs) for job, cs in calls.items()}
    assert dry_runs == {"ns/job": 2, "ns/jab": 0, "ns/jobs": 2, "other/jab": 2, "ns/jib": 2}, dry_runs
    assert all(sum(c.startswith("create Pod") for c in cs) == 3 for cs in calls.values()), calls


def test_accepted_specs_are_bounded() -> None:
    from ddpjob_operator.runtime.pod_check import KEPT, Accepted

    accepted = Accepted(groups=2)
    for i in range(KEPT + 3):
        accepted.add(("ns", "job"), f"spec-{i}")
    assert accepted.of(("ns", "jab")) == {f"spec-{i}" for i in range(3, KEPT + 3)}
    accepted.add(("a", "job"), "x")
    accepted.add(("b", "job"), "y")
    assert accepted.of(("ns", "job")) == frozenset(), "the least recently used group went"
    assert accepted.of(("b", "jobb")) == frozenset() and accepted.of(("b", "bob")) == {"y"}


def test_jobs_starting_at_once_wait_for_the_dry_run_in_flight(events: list[tuple[str, str]]) -> None:  # noqa: F811
    """The first passes of a burst run at once (64 workers): 500 jobs still made 256 dry runs with the accepted
    spec shared. One job of a group dry-runs the spec; the others wait for its answer. Refused, the others send
    their own (a verdict is never shared)."""
    import asyncio

    from ddpjob_operator.runtime import controller as ctl

    class SlowDryRuns(DryRunKube):
        def __init__(self, jobs: dict[str, dict[str, Any]], refused: str = "") -> None:
            super().__init__(jobs["job"], refused=refused)
            self.jobs = jobs

        async def create(self, obj: dict[str, Any], *, dry_run: bool = False) -> Created:
            if dry_run:
                await asyncio.sleep(0.05)  # the API server's round trip, while the other passes run
            return await super().create(obj, dry_run=dry_run)

        async def patch_status(self, namespace: str, name: str, status: dict[str, Any],
                               resource_version: str = "") -> dict[str, Any]:
            self.job = self.jobs[name]
            return await super().patch_status(namespace, name, status)

    def run(refused: str) -> list[str]:
        jobs = {name: make_job(name=name).obj() for name in ("job", "jab", "jib", "jub")}
        kube = SlowDryRuns(jobs, refused)

        async def scenario() -> None:
            c = ctl.Controller()
            c.kube = kube  # type: ignore[assignment]  # a duck-typed fake of the API layer
            for body in jobs.values():
                c.job_seen(None, body)
            await asyncio.gather(*(c.reconcile(("ns", name)) for name in jobs))
            c.queue.close()

        asyncio.run(scenario())
        return kube.calls

    accepted = run(refused="")
    assert sum(c.startswith("dry-run") for c in accepted) == 2, accepted
    assert sum(c.startswith("create Pod") for c in accepted) == 4 * 3, "every job's pods, after the one answer"
    refused = run(refused=NO_PRIORITY)
    assert sum(c.startswith("dry-run") for c in refused) == 4, "each job's own dry run: no pod, no shared refusal"
    assert not any(c.startswith("create Pod") for c in refused)

"""Every invalid manifest under tests/integration/invalid is also rejected by parse_ddpjob (the local runner has
no API server); those the API server accepts must give the operator's InvalidSpec message they promise."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from ddpjob_operator.api.spec import InvalidSpec, parse_ddpjob
from ddpjob_operator.kube.refusals import refusal
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.plan import Observed, plan
from ddpjob_operator.planner.policies.pod_verdicts import explain, spec_key

from .factories import at, running_cluster

INVALID = Path(__file__).resolve().parents[2] / "integration" / "invalid"
FILES = sorted(INVALID.glob("*.yaml"))


def header(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if not line.startswith("# "):
            break
        key, _, value = line[2:].partition(": ")
        out[key] = value
    return out


def test_there_are_at_least_15() -> None:
    assert len(FILES) >= 15


#: Refused by the pod API when the operator dry-runs the pods (InvalidSpec), or by admission (CreateRefused): no
#: model can know without an API server (the local runner has none).
CLUSTER_ONLY = ("pod-api", "admission")


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_parse_ddpjob_rejects(path: Path) -> None:
    meta = header(path)
    assert meta.get("expect") and meta.get("rejected-by") in ("api-server", "operator", *CLUSTER_ONLY), \
        f"{path.name}: bad header"
    if meta["rejected-by"] in CLUSTER_ONLY:
        parse_ddpjob(yaml.safe_load(path.read_text()))
        return
    with pytest.raises(InvalidSpec) as err:
        parse_ddpjob(yaml.safe_load(path.read_text()))
    if meta["rejected-by"] == "operator":
        assert meta["expect"] in str(err.value)


def _cluster_answer(path: Path, body: dict[str, object]) -> Observed:
    """What the operator learns from the API server's answer to the dry run of the pods of a cluster-only case."""
    meta = header(path)
    if meta["rejected-by"] == "admission":
        problem = refusal("Pod", "h-rdzv", f'pods "h-rdzv" is forbidden: {meta["expect"]}')
        assert problem.reason == meta["reason"], problem
        return Observed(problems={("Pod", "h-rdzv"): problem}, accepted_pods=frozenset())  # dry run not accepted
    field = meta["expect"].split(":")[0].removeprefix("spec.template.")
    verdict = explain(f'Pod in version "v1" cannot be handled as a Pod: strict decoding error: unknown field '
                      f'"{field}"', rendezvous=False, injected=True)
    return Observed(refused_pods={spec_key(parse_ddpjob(body)): verdict})


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
@pytest.mark.parametrize("pods", ["none", "running"])
def test_the_planner_never_raises_on_it(path: Path, pods: str) -> None:
    """Issue 23 #3: whatever a spec holds, a pass ends in a plan (Failed/InvalidSpec, naming the field), never an
    exception: a planner that raised retried forever with no condition. Also with the job's pods running (an edit
    that made a running job invalid)."""
    body = yaml.safe_load(path.read_text())
    observed = Observed()
    if pods == "running":
        observed = running_cluster(2).observed()  # another job's pods: the plan sees them as this job's
    body["metadata"].update(namespace="ns", uid="uid-1", generation=2)
    if header(path)["rejected-by"] in CLUSTER_ONLY:
        answer = _cluster_answer(path, body)
        observed = replace(observed, problems=answer.problems, refused_pods=answer.refused_pods,
                           accepted_pods=answer.accepted_pods)
        if header(path)["rejected-by"] == "admission":  # held, never Failed: it may pass later
            result = plan(body, replace(observed, pods=()), at(5))
            refused = st.get_condition(result.status, st.CREATE_REFUSED) or {}
            assert refused.get("reason") == header(path)["reason"] and not result.create_pods, result.status
            assert result.check_pods, "the dry run is tried again (with backoff)"
            return
    result = plan(body, observed, at(5))
    assert st.condition_true(result.status, st.FAILED), result.status
    failed = st.get_condition(result.status, st.FAILED) or {}
    assert failed["reason"] == "InvalidSpec" and failed["message"], failed
    assert not result.create_pods

"""Every invalid manifest under tests/integration/invalid is also rejected by parse_ddpjob (the local runner has
no API server); those the API server accepts must give the operator's InvalidSpec message they promise."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ddpjob_operator.api.spec import InvalidSpec, parse_ddpjob
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.plan import Observed, plan

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


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_parse_ddpjob_rejects(path: Path) -> None:
    meta = header(path)
    assert meta.get("expect") and meta.get("rejected-by") in ("api-server", "operator"), f"{path.name}: bad header"
    with pytest.raises(InvalidSpec) as err:
        parse_ddpjob(yaml.safe_load(path.read_text()))
    if meta["rejected-by"] == "operator":
        assert meta["expect"] in str(err.value)


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
    result = plan(body, observed, at(5))
    assert st.condition_true(result.status, st.FAILED), result.status
    failed = st.get_condition(result.status, st.FAILED) or {}
    assert failed["reason"] == "InvalidSpec" and failed["message"], failed
    assert not result.create_pods

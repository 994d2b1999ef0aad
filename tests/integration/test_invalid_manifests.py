"""Every invalid DDPJob in tests/integration/invalid/ is refused with a message a user understands: by the API
server (schema, CEL) before anything is stored, by the operator as Failed/InvalidSpec with no pods created (its
model, or the pod API's dry run of the pods: ``pod-api``), or, refused by admission (``admission``), held with
CreateRefused naming the real cause before any pod exists."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import Cluster, wait_for
from tests.integration.operator_support import Jobs, OperatorProcess

INVALID = Path(__file__).parent / "invalid"
CASES = sorted(INVALID.glob("*.yaml"))


def _header(path: Path, key: str) -> str:
    for line in path.read_text().splitlines():
        if line.startswith(f"# {key}:"):
            return line.removeprefix(f"# {key}:").strip()
    raise AssertionError(f"{path.name}: needs a '# {key}: ...' header line")


def test_there_are_at_least_15_cases() -> None:
    assert len(CASES) >= 15, [p.name for p in CASES]


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_invalid_manifest_is_rejected_with_a_clear_message(
    cluster: Cluster, namespace: str, operator: OperatorProcess, jobs: Jobs, path: Path
) -> None:
    expected = _header(path, "expect")
    layer = _header(path, "rejected-by")
    text = path.read_text()
    dry = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=text, check=False)
    rejected_by_server = dry.returncode != 0
    assert rejected_by_server == (layer == "api-server"), f"{path.name}: expected rejection by {layer}:\n{dry.stderr}"
    if rejected_by_server:
        assert expected in dry.stderr, f"API server rejected {path.name}, but not with {expected!r}:\n{dry.stderr}"
        return
    # The schema let it through: the operator must refuse it, say why, and create nothing.
    name = yaml.safe_load(text)["metadata"]["name"]
    jobs.apply(text)
    if layer == "admission":  # may pass later (the PriorityClass created): held and retried, never Failed
        refused = jobs.wait_condition(name, "CreateRefused", timeout=30)
        assert refused["reason"] == _header(path, "reason"), refused
        assert expected in refused["message"] and "RBAC" not in refused["message"], refused["message"]
        assert not jobs.condition(name, "Failed")
        assert not jobs.pods(name) and not jobs.pods(name, kind="rendezvous")
        return
    failed = jobs.wait_condition(name, "Failed", timeout=30)
    assert failed["reason"] == "InvalidSpec", failed
    assert expected in failed["message"], f"{path.name}: {failed['message']!r} lacks {expected!r}"
    assert not jobs.pods(name) and not jobs.pods(name, kind="rendezvous")
    # No crash loop: the operator is still alive and healthy.
    wait_for(operator.healthy, timeout=10, describe="operator still healthy")

"""Issue 44 #8: every file in manifests/examples/ is applied by the e2e tier (tests/e2e/test_install.py: the CPU
example; tests/e2e/test_examples.py: the others), or says in its first line why it cannot be."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.examples import APPLIED, BY_TEST_INSTALL, EXAMPLES

pytestmark = pytest.mark.unit


def _example_files() -> list[str]:
    return sorted(str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*.yaml"))


def test_every_example_is_applied_in_e2e_or_says_why_not_in_its_first_line() -> None:
    applied = BY_TEST_INSTALL | set(APPLIED) | {f for _, before in APPLIED.values() for f in before}
    unexplained = [f for f in _example_files() if f not in applied
                   and "not applied by the e2e tier" not in (EXAMPLES / f).read_text().splitlines()[0]]
    assert not unexplained, (f"{unexplained}: apply them in tests/e2e/test_examples.py (tests/e2e/examples.py), "
                             "or say in their first line why they are 'not applied by the e2e tier'")
    assert not applied - set(_example_files()), "tests/e2e/examples.py names a file manifests/examples/ lacks"
    assert "cpu-charlm.yaml" in Path(__file__).parents[1].joinpath("e2e", "test_install.py").read_text()

"""hack/timings.py: the timing table `make test` prints (pure formatting and sums)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

_spec = importlib.util.spec_from_file_location("timings", Path(__file__).parents[2] / "hack" / "timings.py")
assert _spec and _spec.loader
timings = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(timings)


@pytest.mark.parametrize(("found", "total", "footnote"), [
    ([("venv", 2.0, "0"), ("tools", 3.0, "0")], "5.0", False),
    # nested rows (a build inside tools) are not added again
    ([("  build/etcd", 80.0, "0"), ("tools", 100.0, "0")], "100.0", False),
    # a phase that ran beside another is inside the other's time: not in the sum, and the table says why
    ([("venv*", 186.0, "0"), ("tools", 900.0, "0"), ("images*", 200.0, "0"), ("pytest", 600.0, "0")],
     "1500.0", True),
])
def test_sum_leaves_out_nested_and_concurrent_rows(found: list[tuple[str, float, str]], total: str,
                                                   footnote: bool) -> None:
    out = timings.table(found, None)
    summed = next(line for line in out.splitlines() if line.startswith("sum of top-level phases"))
    assert summed.split()[-2] == total
    assert ("ran beside" in out) is footnote


def test_a_phases_nested_rows_follow_it(tmp_path: Path) -> None:
    f = tmp_path / "t.tsv"
    f.write_text("  build/etcd\t80.0\t0\ntools\t100.0\t0\nnot a row\n")
    lines = timings.table(timings.rows(f), 101.0).splitlines()
    assert [line.split()[0] for line in lines[2:4]] == ["tools", "build/etcd"]
    assert lines[-1].startswith("make test, wall")

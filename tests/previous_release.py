"""The release before this tree, for the upgrade tests (tests/integration/test_upgrade.py on kwok, the e2e
tests/e2e/test_upgrade.py on real nodes): the commit before the last change of the CRD's fields, its chart, and
docs/lifecycle.md's `helm upgrade` line as written."""

from __future__ import annotations

import io
import shlex
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import Cluster

REPO = Path(__file__).resolve().parents[1]
CRD_PATH = REPO / "operator" / "ddpjob_operator" / "crd" / "ddpjob-crd.yaml"
CRD_SOURCE = str(CRD_PATH.relative_to(REPO))


def git(*args: str) -> bytes:
    proc = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, check=False)
    if proc.returncode != 0:
        pytest.fail(f"git {' '.join(args)}: {proc.stderr.decode().strip()} (this test needs the repository's "
                    "history: in a shallow clone run `git fetch --unshallow`)")
    return proc.stdout


def _fields_at(rev: str) -> set[str] | None:
    """The CRD source's field paths at ``rev``; None where the file is not at that path (before it moved there)."""
    proc = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{CRD_SOURCE}"], capture_output=True, check=False)
    return field_paths(yaml.safe_load(proc.stdout)) if proc.returncode == 0 else None


def previous_rev() -> str:
    """The commit before the last change to the CRD's fields. A change of descriptions only adds no field to look
    for, so it does not count."""
    rev = ""
    for last in git("log", "--format=%H", "--", CRD_SOURCE).decode().split():
        rev = git("rev-parse", f"{last}^").decode().strip()
        before = _fields_at(rev)
        if before is None or before != _fields_at(last):
            break
    assert rev, f"{CRD_SOURCE} has no history"
    return rev


def extract(rev: str, dest: Path, *paths: str) -> Path:
    """``paths`` of the tree at ``rev`` written under ``dest`` (every tracked file when none is given)."""
    with tarfile.open(fileobj=io.BytesIO(git("archive", rev, *paths))) as tar:
        tar.extractall(dest, filter="data")
    return dest


def previous_chart(dest: Path) -> tuple[str, Path]:
    """The chart as of previous_rev(): (that commit, its chart folder)."""
    rev = previous_rev()
    return rev, extract(rev, dest, "charts/ddpjob-operator") / "charts" / "ddpjob-operator"


def field_paths(crd: dict[str, Any]) -> set[str]:
    """Every property path of the served version's schema, e.g. "spec.networkPolicy"."""
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    out: set[str] = set()

    def walk(node: dict[str, Any], prefix: str) -> None:
        for name, sub in node.get("properties", {}).items():
            path = f"{prefix}{name}"
            out.add(path)
            walk(sub, f"{path}.")

    walk(schema, "")
    return out


def newest_field(old_chart: Path) -> str:
    """A field this tree's CRD serves and the old chart's does not (the shortest path: a top-level one if any)."""
    old_crd = next(old_chart.glob("*/ddpjob-crd.yaml"))
    new_fields = field_paths(yaml.safe_load(CRD_PATH.read_text())) - field_paths(yaml.safe_load(old_crd.read_text()))
    assert new_fields, f"the CRD of {old_chart} has every field of this tree's"
    return min(new_fields, key=lambda p: (p.count("."), p))


def docs_upgrade_command(namespace: str, chart: Path) -> list[str]:
    """docs/lifecycle.md's `helm upgrade` line (without `helm`), pointed at ``namespace`` and ``chart``."""
    text = (REPO / "docs" / "lifecycle.md").read_text()
    section = text.split("## Upgrade", 1)[1]
    line = next(ln for ln in section.splitlines() if ln.startswith("helm upgrade "))
    words = shlex.split(line)
    assert "charts/ddpjob-operator" in words and "ddpjob-system" in words, line
    return [str(chart) if w == "charts/ddpjob-operator" else namespace if w == "ddpjob-system" else w
            for w in words[1:]]


def served(cluster: Cluster, path: str) -> bool:
    """Whether the API server's published schema has the field (what `kubectl explain` reads)."""
    return cluster.kubectl("explain", f"ddpjobs.{path}", check=False).returncode == 0

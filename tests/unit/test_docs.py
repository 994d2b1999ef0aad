"""The docs name only what exists (issue 26): every `make` target, `ddpjob` command, repository path and DDPJob
field that README.md and docs/ write in code must be in the Makefile, the CLI, the tree and the CRD's schema."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
#: `make a b` (targets start with a letter; ``VAR=value`` and flags end the list).
MAKE = re.compile(r"(?:^|[\s;&(])make((?:\s+[A-Za-z][A-Za-z0-9_-]*(?![=\w-]))+)")
#: A command line that runs the CLI (`ddpjob run job.yaml`, `.venv/bin/ddpjob operator`, the kubectl plugin's
#: `kubectl ddpjob describe JOB`), not prose in code.
DDPJOB = re.compile(r"(?:^|&&|;|\|)\s*(?:\$ )?(?:kubectl )?(?:\S*/)?ddpjob ([a-z][a-z-]*)")
#: Repository paths as the docs write them: a top-level folder of ours, then a path (globs and placeholders are
#: not paths).
PATH = re.compile(r"^(?:\./)?((?:docs|bench|hack|tests|manifests|charts|operator|worker)/[\w./-]+?)/?(?:::\S+)?$")


def code(doc: Path) -> Iterator[str]:
    """Inline code spans and the lines of fenced blocks."""
    text = doc.read_text(encoding="utf-8")
    for block in FENCE.findall(text):
        yield from block.splitlines()
    yield from CODE_SPAN.findall(FENCE.sub("", text))


def make_targets() -> set[str]:
    targets: set[str] = set()
    for mk in [ROOT / "Makefile", *sorted((ROOT / "hack" / "make").glob("*.mk"))]:
        for line in mk.read_text(encoding="utf-8").splitlines():
            if m := re.match(r"^([A-Za-z0-9_-]+(?:\s+[A-Za-z0-9_-]+)*)\s*:(?!=)", line):
                targets.update(m[1].split())
    return targets


def cli_commands() -> set[str]:
    import typer
    from ddpjob_operator.cli.app import app

    group: Any = typer.main.get_command(app)
    return set(group.commands)


def crd_spec() -> dict[str, Any]:
    crd = yaml.safe_load((ROOT / "operator" / "ddpjob_operator" / "crd" / "ddpjob-crd.yaml").read_text())
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    spec: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec


def has_field(schema: dict[str, Any], path: str) -> bool:
    """``a.b.c`` under ``schema``; a field that keeps unknown fields (a pod template) has any sub-field."""
    node = schema
    for part in path.split("."):
        if node.get("x-kubernetes-preserve-unknown-fields") and part not in node.get("properties", {}):
            return True
        node = node.get("properties", {}).get(part) or node.get("items", {}).get("properties", {}).get(part)
        if node is None:
            return False
    return True


def where(doc: Path) -> str:
    return str(doc.relative_to(ROOT))


def test_every_make_target_the_docs_name_exists() -> None:
    targets = make_targets()
    missing = sorted({(where(doc), t) for doc in DOCS for snippet in code(doc) for m in MAKE.finditer(snippet)
                      for t in m[1].split() if "=" not in t and t not in targets})
    assert not missing, f"`make` targets the docs name but no Makefile has: {missing}"


def test_every_ddpjob_command_the_docs_name_exists() -> None:
    commands = cli_commands()
    missing = sorted({(where(doc), m[1]) for doc in DOCS for snippet in code(doc)
                      for m in DDPJOB.finditer(snippet) if m[1] not in commands})
    assert not missing, f"`ddpjob` commands the docs name but the CLI lacks ({sorted(commands)}): {missing}"


def test_every_repository_path_the_docs_name_exists() -> None:
    missing = sorted({(where(doc), m[1]) for doc in DOCS for snippet in code(doc)
                      if (m := PATH.match(snippet.strip())) and not (ROOT / m[1]).exists()})
    assert not missing, f"paths the docs name that are not in the tree: {missing}"


def test_every_spec_field_in_the_api_reference_is_in_the_crd() -> None:
    spec = crd_spec()
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    section = text[text.index("## `spec`"):]
    section = section[:section.index("\n## ", 1)]
    rows = [name for line in section.splitlines() if line.startswith("| `")
            for name in re.findall(r"`([A-Za-z][\w.]*)`", line.split("|")[1])]
    assert len(rows) > 20, "the spec table was not found"
    missing = [name for name in rows if not has_field(spec, name)]
    assert not missing, f"docs/api.md's spec table names fields the CRD does not have: {missing}"


def test_every_spec_path_the_api_reference_writes_is_in_the_crd() -> None:
    """``spec.a.b`` in docs/api.md's code (other pages' ``spec.`` are often a pod's or a Workload's)."""
    spec, doc = crd_spec(), ROOT / "docs" / "api.md"
    missing = sorted({m[1] for snippet in code(doc)
                      for m in re.finditer(r"(?<![\w.])spec\.([A-Za-z][\w.]*[A-Za-z0-9])", snippet)
                      if m[1] != "py" and not has_field(spec, m[1])})
    assert not missing, f"spec.* paths docs/api.md writes that the CRD does not have: {missing}"


def test_the_rbac_tables_are_the_operators_permissions() -> None:
    """docs/packaging.md's RBAC tables list exactly kube.PERMISSIONS and kube.CLUSTER_PERMISSIONS."""
    from ddpjob_operator.kube.client import CLUSTER_PERMISSIONS, PERMISSIONS

    text = (ROOT / "docs" / "packaging.md").read_text(encoding="utf-8")
    section = text[text.index("### RBAC"):]
    section = section[:section.index("\n## ")]
    documented: dict[str, tuple[str, ...]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) == 3 and cells[0].startswith("`"):
            for resource in re.findall(r"`([a-z/]+)`", cells[0]):
                documented[resource] = tuple(sorted(cells[1].split()))
    every = {**PERMISSIONS, **CLUSTER_PERMISSIONS}
    granted = {resource: tuple(sorted(verbs)) for (_, resource), verbs in every.items()}
    assert documented == granted


def test_the_reasons_table_is_api_reasons() -> None:
    """docs/api.md's "Reasons" table lists exactly the constants of api/reasons.py, each once."""
    from ddpjob_operator.api import reasons

    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    start = text.index("\n### Reasons\n") + len("\n### Reasons\n")
    end = re.compile(r"^##+ ", re.M).search(text, start)
    rows = [m[1] for line in text[start:end.start() if end else None].splitlines()
            if (m := re.match(r"^\| `(\w+)` \|", line))]
    assert len(rows) > 50, "the Reasons table was not found"
    constants = {value for name, value in vars(reasons).items() if name.isupper() and isinstance(value, str)}
    assert len(rows) == len(set(rows)), f"reasons listed twice: {sorted({r for r in rows if rows.count(r) > 1})}"
    assert set(rows) - constants == set(), "in docs/api.md's Reasons table, not in api/reasons.py"
    assert constants - set(rows) == set(), "in api/reasons.py, not in docs/api.md's Reasons table"


def _spec_paths(node: dict[str, Any], prefix: str = "") -> list[str]:
    """The CRD's spec fields as dotted paths, down to the leaves (a free-form object is a leaf)."""
    props = node.get("properties") or {}
    if not props or node.get("x-kubernetes-preserve-unknown-fields"):
        return [prefix] if prefix else []
    return [p for name, sub in props.items() for p in _spec_paths(sub, f"{prefix}.{name}" if prefix else name)]


def test_the_field_audit_covers_every_spec_field_and_cites_cases_that_exist() -> None:
    """docs/api.md's "Field audit": a row for every field of the CRD's spec (a row may name a parent, ``x.*``, or
    siblings after its first name), and every tests/integration/invalid/ case it cites is there."""
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    section = text[text.index("### Field audit"):]
    section = section[:section.index("\n## ")]
    named: list[str] = []
    cited: list[tuple[str, str]] = []
    for line in section.splitlines():
        cells = line.split("|")
        if len(cells) < 5 or not cells[1].strip().startswith(("`", "labels", "pod labels")):
            continue
        names = re.findall(r"`([A-Za-z][\w.*\[\]]*)`", cells[1])
        base = names[0].rpartition(".")[0] if names else ""
        named += [n if "." in n or not base else f"{base}.{n}" for n in names]
        cited += re.findall(r"invalid/(\d\d)(?:\.\.(\d\d))?", cells[4])
    assert len(named) > 20, "the Field audit table was not found"

    def covered(path: str) -> bool:
        return any(n == path or path.startswith(n.removesuffix("*").rstrip(".") + ".")
                   or n.startswith((path + ".", path + "[")) for n in named)

    missing = [p for p in _spec_paths(crd_spec()) if not covered(p)]
    assert not missing, f"spec fields without a row in docs/api.md's Field audit: {missing}"
    cases = {p.name[:2] for p in (ROOT / "tests" / "integration" / "invalid").glob("*.yaml")}
    numbers = {f"{n:02d}" for lo, hi in cited for n in range(int(lo), int(hi or lo) + 1)}
    assert numbers and numbers <= cases, f"Field audit cites invalid/ cases that do not exist: {numbers - cases}"

"""The operator's layers hold (docs/architecture.md): the import contracts in .importlinter fail on an upward import,
and private names of kopf and torch stay in the one module each that quarantines them."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
OPERATOR = ROOT / "operator" / "ddpjob_operator"
WORKER = ROOT / "worker" / "ddpjob_worker"
#: import-linter's CLI through this interpreter (its console script lives in the shared dependency venv).
LINT_IMPORTS = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
                "sys.exit(lint_imports_command())"]
#: The only module that may name kopf's private API, and the only package that may name torch's.
KOPF_QUARANTINE = OPERATOR / "kube" / "kopf_compat.py"
TORCH_QUARANTINE = WORKER / "compat"


def lint_imports(package_root: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports with the repository's contracts over the packages found first under ``package_root``."""
    env = {**os.environ, "PYTHONPATH": f"{package_root}{os.pathsep}{ROOT / 'worker'}"}
    return subprocess.run([*LINT_IMPORTS, "--config", str(ROOT / ".importlinter"), "--no-cache"],
                          cwd=package_root, env=env, capture_output=True, text=True, timeout=120)


def test_the_contracts_hold() -> None:
    run = lint_imports(ROOT / "operator")
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize(("module", "planted", "says"), [
    pytest.param("planner/plan.py", "from ddpjob_operator.runtime import controller", "planner.plan -> "
                 "ddpjob_operator.runtime.controller", id="planner-imports-runtime"),
    pytest.param("api/spec.py", "from ddpjob_operator.planner import status", "api.spec -> "
                 "ddpjob_operator.planner.status", id="api-imports-planner"),
    pytest.param("planner/policies/stall.py", "import asyncio", "not allowed to import asyncio",
                 id="planner-imports-asyncio"),
    pytest.param("planner/children/builders.py", "import os", "not allowed to import os", id="planner-reads-os"),
])
def test_a_planted_import_fails_the_contracts(tmp_path: Path, module: str, planted: str, says: str) -> None:
    copy = tmp_path / "ddpjob_operator"
    shutil.copytree(OPERATOR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / module
    target.write_text(target.read_text() + f"\n{planted}  # planted by the test\n")
    run = lint_imports(tmp_path)
    assert run.returncode != 0, f"lint-imports accepted {planted!r} in {module}:\n{run.stdout}"
    assert says in run.stdout.replace("\n", " "), run.stdout


def _python_files(root: Path) -> Iterator[Path]:
    yield from (p for p in sorted(root.rglob("*.py")) if "__pycache__" not in p.parts)


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for an attribute chain on a name, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def named_modules(path: Path) -> Iterator[tuple[int, str]]:
    """Every module path the code names: imports, and attribute chains such as ``torch._C.x`` (code, not comments
    or docstrings)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, node.module
            yield from ((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
        elif isinstance(node, ast.Attribute) and (name := _dotted(node)) is not None:
            yield node.lineno, name


def private(name: str, root: str) -> bool:
    """Whether ``name`` reaches a private part of package ``root`` (a component with one leading underscore)."""
    parts = name.split(".")
    return parts[0] == root and any(p.startswith("_") and not p.startswith("__") for p in parts[1:])


@pytest.mark.parametrize(("root", "allowed"), [("kopf", KOPF_QUARANTINE), ("torch", TORCH_QUARANTINE)])
def test_private_names_only_in_their_quarantine(root: str, allowed: Path) -> None:
    found = [f"{path.relative_to(ROOT)}:{line}: {name}"
             for base in (OPERATOR, WORKER) for path in _python_files(base)
             if path != allowed and allowed not in path.parents
             for line, name in named_modules(path) if private(name, root)]
    assert not found, f"private {root} names outside {allowed.relative_to(ROOT)}:\n" + "\n".join(found)


def test_the_quarantines_are_where_the_test_looks() -> None:
    """The checks above would pass vacuously if the quarantine moved: each must name what it quarantines."""
    assert any(private(n, "kopf") for _, n in named_modules(KOPF_QUARANTINE))
    assert any(private(n, "torch") for p in _python_files(TORCH_QUARANTINE) for _, n in named_modules(p))

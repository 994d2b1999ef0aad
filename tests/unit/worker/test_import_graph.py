"""The worker package imports without cycles: interfaces sit where their consumers import them (storage_api holds
the Storage Protocol that checkpoint, fencing and storage use; fencing and storage imported each other for it), and
each module of the checkpoint library imports on its own, in any order."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import ddpjob_worker

PACKAGE = Path(ddpjob_worker.__file__).parent
#: The checkpoint library (ddpjob_worker/__init__.py): each must import alone, as a script may import just one.
LIBRARY = ("storage_api", "fencing", "storage", "staging", "payload", "preemption", "replicas", "rngstate",
           "checkpoint", "sampler", "globalbatch", "progress", "statusclient")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Each module of the package and the package's modules it imports anywhere: at the top, in a function, or
    under TYPE_CHECKING (a cycle there still ties the two modules together)."""
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # ``from pkg import module`` names a module; ``from module import name`` names the module.
                targets |= {f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                            for alias in node.names}
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules along it (the first again at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*path[path.index(target):], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_worker_package_has_no_import_cycle() -> None:
    assert find_cycle(import_graph()) is None


def test_the_cycle_check_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_storage_interface_depends_on_nothing_of_the_package() -> None:
    assert import_graph()["ddpjob_worker.storage_api"] == set()


#: Imports torch once (third-party only: the order of our own modules is what is tested), then each module in a
#: forked child that has imported nothing of ddpjob_worker: as alone as a fresh interpreter, without paying for
#: ``import torch`` per module.
IMPORT_EACH_ALONE = textwrap.dedent("""
    import importlib, os, sys, traceback
    import numpy, torch, torch.distributed, torch.utils.data

    assert not any(m.startswith("ddpjob_worker") for m in sys.modules)
    failed = []
    for name in sys.argv[1:]:
        pid = os.fork()
        if pid == 0:
            try:
                importlib.import_module(f"ddpjob_worker.{name}")
            except BaseException:
                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        if os.waitpid(pid, 0)[1] != 0:
            failed.append(name)
    print(failed)
""")


def test_each_library_module_imports_alone() -> None:
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", IMPORT_EACH_ALONE, *LIBRARY], capture_output=True,
                          text=True, timeout=240, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr[-3000:]


def test_the_package_and_the_storage_interface_import_without_torch() -> None:
    """The package map (``ddpjob_worker/__init__.py``) and the interface a custom storage implements import
    nothing heavy: a storage or a tool may name the types without loading torch."""
    code = ("import sys, ddpjob_worker, ddpjob_worker.storage_api; "
            "print(sorted(m for m in sys.modules if m.partition('.')[0] in ('torch', 'numpy')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"

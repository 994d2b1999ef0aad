"""The injected runtime runs on the user's Python and torch alone: no runtime module may import numpy or the
kubernetes client when it is imported (the checkpoint library, which scripts import themselves, may use numpy)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

#: Every module on the runtime's path, from ``ddp-worker`` to the trainer and the rendezvous store.
RUNTIME_MODULES = ("entrypoint", "launch", "agent", "warm", "recorded", "autoprogress", "progress", "storekeeper",
                   "causes", "contract", "termlog", "logs", "procs", "rdzv", "bootstrap", "compat", "storeserver",
                   "storestate", "sender", "redact")

# ModuleNotFoundError, as for a package that is not installed: torch probes for numpy and goes on without it.
BLOCKED_IMPORTS = textwrap.dedent("""
    import importlib, sys

    class Absent:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in ("numpy", "kubernetes"):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
            return None

    sys.meta_path.insert(0, Absent())
    for module in sys.argv[1:]:
        importlib.import_module(f"ddpjob_worker.{module}")
    print(sorted(m for m in sys.modules if m.partition(".")[0] in ("numpy", "kubernetes")))
""")


def test_runtime_modules_import_without_numpy_and_the_kubernetes_client() -> None:
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", BLOCKED_IMPORTS, *RUNTIME_MODULES],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"


def test_the_blocker_blocks() -> None:
    """The check above proves something only if a module that needs numpy fails under it."""
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", BLOCKED_IMPORTS, "checkpoint"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode != 0 and "blocked by the test" in proc.stderr, proc.stderr[-3000:]

"""The injected runtime's first step inside a user's image (docs/worker.md): check that the image's Python can run
the worker runtime at all, before torchrun or any rendezvous, and say in one line what is missing and in which
image; then hand over to ``ddp-worker`` with the runtime on every child process's PYTHONPATH.

Imports nothing but the standard library and ddpjob_worker.contract: it runs before anything is known about the
image, and torch is looked up without importing it (an import costs seconds and could itself crash)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Mapping, MutableMapping, Sequence

from ddpjob_worker import contract

_VERSION_RE = re.compile(r"^(\d+)\.(\d+)")
_VERSION_FILE_RE = re.compile(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", re.MULTILINE)


def torch_version(find_spec: Callable[[str], object | None] = importlib.util.find_spec,
                  dist_version: Callable[[str], str] = importlib.metadata.version) -> str | None:
    """torch's version string without importing it; None when this Python has no torch. A source build without
    package metadata (some vendor images) still has torch/version.py."""
    spec = find_spec("torch")
    if spec is None:
        return None
    try:
        return dist_version("torch")
    except importlib.metadata.PackageNotFoundError:
        pass
    for folder in getattr(spec, "submodule_search_locations", None) or []:
        try:
            with open(os.path.join(folder, "version.py")) as f:
                found = _VERSION_FILE_RE.search(f.read())
        except OSError:
            continue
        if found:
            return found.group(1)
    return "unknown"


def release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a torch version such as 2.8.0+cu128 or 2.6.0a0+ecf3bae.nv25.01; None if unreadable."""
    found = _VERSION_RE.match(version)
    return (int(found.group(1)), int(found.group(2))) if found else None


def _dotted(release: tuple[int, int]) -> str:
    return ".".join(map(str, release))


def image_problem(image: str, python: str, torch: str | None) -> str | None:
    """Why this image cannot run the runtime (one line naming the image and the fix), or None when it can."""
    lo, hi = _dotted(contract.TORCH_MIN_VERSION), _dotted(contract.TORCH_MAX_TESTED_VERSION)
    where = f"image {image or '(unknown)'}: {python}"
    if torch is None:
        return (f"{where} cannot import torch; the injected ddpjob runtime runs torchrun with the image's own Python: "
                f"install torch {lo} to {hi} in the image (pip install torch), or use a command whose python has it")
    found = release(torch)
    if found is not None and found < contract.TORCH_MIN_VERSION:
        return f"{where} has torch {torch}, older than the oldest supported ({lo}); use torch {lo} to {hi}"
    return None


def torch_warning(torch: str) -> str | None:
    """A line for the log when torch is newer than the tested range (it runs, but nobody has proven it)."""
    found = release(torch)
    if found is None or found > contract.TORCH_MAX_TESTED_VERSION:
        return (f"torch {torch} is outside the tested range ({_dotted(contract.TORCH_MIN_VERSION)} to "
                f"{_dotted(contract.TORCH_MAX_TESTED_VERSION)}); going on")
    return None


def put_on_pythonpath(lib: str, environ: MutableMapping[str, str]) -> None:
    """Put the runtime first on PYTHONPATH: torchrun's agent and the trainers are new interpreters, and the
    image's own PYTHONPATH (its ENV) is kept behind it."""
    current = environ.get("PYTHONPATH", "")
    parts = [p for p in current.split(os.pathsep) if p and p != lib]
    environ["PYTHONPATH"] = os.pathsep.join([lib, *parts])


def fail(message: str, environ: Mapping[str, str]) -> int:
    """Report an image that cannot run the runtime: stderr and the termination log; returns EXIT_BAD_IMAGE."""
    from ddpjob_worker import termlog

    print(f"ddp-worker: {message} (exit {contract.EXIT_BAD_IMAGE})", file=sys.stderr)
    termlog.write_termination_log(message, environ)
    return contract.EXIT_BAD_IMAGE


def worker_main(argv: Sequence[str], lib: str) -> int:
    """``<python> /ddpjob/bin/ddp-worker -- CMD``: check the image, then run ddp-worker (which execs torchrun)."""
    image = os.environ.get(contract.DDPJOB_IMAGE, "")
    torch = torch_version()
    problem = image_problem(image, f"{sys.executable} (Python {sys.version.split()[0]})", torch)
    if problem is not None:
        return fail(problem, os.environ)
    put_on_pythonpath(lib, os.environ)
    from ddpjob_worker import entrypoint
    from ddpjob_worker.logs import get_logger

    warning = torch_warning(torch or "")
    if warning:
        get_logger("bootstrap").warning("%s", warning)
    entrypoint.main(list(argv))
    return 0

"""Runs any training script or module as ``__main__`` under torchelastic's ``@record``, so its failures leave an
error file (the root cause the agent reports) without the script decorating anything itself:
``python -m ddpjob_worker.recorded (--module MOD | SCRIPT) ARGS...``; ddp-worker puts it under torchrun."""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Sequence

from ddpjob_worker import contract

_USAGE = "usage: python -m ddpjob_worker.recorded (--module MODULE | SCRIPT) [ARGS...]"


def _run(target: str, as_module: bool, args: list[str]) -> None:
    """Execute ``target`` the way ``python [-m] target args`` would (sys.argv, sys.path[0], ``__main__``)."""
    if as_module:
        sys.argv = [target, *args]  # runpy replaces argv[0] with the module's file, as python -m does
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(target))
        runpy.run_path(target, run_name="__main__")


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry; exceptions propagate (so the exit code is python's) after ``@record`` wrote them down."""
    if os.environ.get(contract.DDPJOB_STANDBY) == "1":
        # A pre-started trainer: torch gets imported now, the rank and the rest of the environment later.
        from ddpjob_worker import warm

        warm.standby()
    from torch.distributed.elastic.multiprocessing.errors import record

    args = list(sys.argv[1:] if argv is None else argv)
    as_module = bool(args) and args[0] in ("--module", "-m")
    if as_module:
        args = args[1:]
    if not args or args[0].startswith("-"):
        print(_USAGE, file=sys.stderr)
        raise SystemExit(2)
    # record turns SystemExit(0) into a normal return and re-raises every other exit, so codes are kept.
    record(_run)(args[0], as_module, args[1:])


if __name__ == "__main__":
    main()

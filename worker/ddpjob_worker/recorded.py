"""Runs any training script or module as ``__main__`` under torchelastic's ``@record``, so its failures leave an
error file (the root cause the agent reports), and on rank 0 counts its optimizer steps as progress
(ddpjob_worker.autoprogress), without the script decorating or calling anything itself:
``python -m ddpjob_worker.recorded (--module MOD | SCRIPT) ARGS...``; ddp-worker puts it under torchrun."""

from __future__ import annotations

import atexit
import gc
import io
import os
import runpy
import socket
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import NoReturn

from ddpjob_worker import contract, frameworks

_USAGE = "usage: python -m ddpjob_worker.recorded (--module MODULE | SCRIPT) [ARGS...]"


def _run(target: str, as_module: bool, args: list[str]) -> None:
    """Execute ``target`` the way ``python [-m] target args`` would (sys.argv, sys.path[0], ``__main__``); an exit
    by which the script's framework says that a peer rank was stopped becomes a failure (frameworks.PeerStopped),
    so that the agent re-forms the group instead of taking this rank for finished."""
    try:
        _run_script(target, as_module, args)
    except SystemExit as stop:
        why = frameworks.peer_stopped(stop)
        if why is None:
            raise
        raise frameworks.PeerStopped(why) from None


def _run_script(target: str, as_module: bool, args: list[str]) -> None:
    if as_module:
        sys.argv = [target, *args]  # runpy replaces argv[0] with the module's file, as python -m does
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(target))
        runpy.run_path(target, run_name="__main__")


def await_rank0_store(environ: Mapping[str, str] = os.environ, timeout: float = 60.0, poll: float = 0.02) -> bool:
    """On ranks other than 0, wait until rank 0's trainer listens at MASTER_ADDR:MASTER_PORT (it hosts the
    process group's TCPStore: the agent's store is not shared, see contract). Without this, a trainer that comes
    up before rank 0 gets "connection refused", and torch's client retries only after an exponential backoff
    with jitter (0.5-1.5 s at first): a second lost on about every other restart. The name is resolved once;
    after ``timeout``, or when it cannot be resolved, torch's own retries take over. True when it listened."""
    if environ.get("RANK", "0") == "0" or environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        return False
    host, port = environ.get("MASTER_ADDR"), environ.get("MASTER_PORT", "")
    if not host or not port.isdigit():
        return False
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)[0]
    except OSError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket(family, kind, proto) as probe:
            probe.settimeout(1.0)
            if probe.connect_ex(address) == 0:
                return True
        time.sleep(poll)
    return False


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
    await_rank0_store()
    from ddpjob_worker import autoprogress, compat

    if compat.gloo_teardown_may_hang():
        compat.keep_process_groups()  # and the trainer leaves by os._exit after success too (cli)

    counting = autoprogress.install()
    # record turns SystemExit(0) into a normal return and re-raises every other exit, so codes are kept.
    record(_run)(args[0], as_module, args[1:])
    if counting is not None:
        counting.close()


def leave(code: int) -> NoReturn:
    """Exit now, without the interpreter's final teardown: with torch loaded it took 1.0-1.2 s here after a
    failure, and torchrun's agent restarts the group only once this process is gone, so every recovery waited
    for it. What that teardown does that anyone could miss is done first: non-daemon threads are joined (a
    background checkpoint write in flight), atexit handlers run (DataLoader workers, user hooks), and every open
    file's buffer is flushed."""
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for obj in gc.get_objects():
        if isinstance(obj, io.IOBase):
            try:
                if not obj.closed and obj.writable():
                    obj.flush()
            except (OSError, ValueError):  # a broken pipe or a detached buffer: nothing left to save there
                pass
    os._exit(code)


def cli() -> None:
    """``python -m ddpjob_worker.recorded``: main(), and the trainer leaves at once (leave), whether it failed (an
    exception, or a non-zero exit such as 143 after its SIGTERM checkpoint) or succeeded.

    Success used to go through the interpreter's teardown (on torches whose gloo teardown cannot hang), but that
    teardown can abort the process: a daemon thread still inside torch's C++ (a store call, a gloo thread) is ended
    by the finalizing interpreter with an unwind that C++ turns into std::terminate ("terminate called without an
    active exception", SIGABRT). Seen twice in CI on 2026-12-06 (torch 2.15, tests/worker): a trainer that had
    printed "done" died by signal 6, its agent restarted the group, waited for peers that had finished, and
    exited 200 two minutes later. Python does not promise ``__del__`` at exit anyway; what teardown does that a
    script may rely on (atexit, non-daemon threads, buffered files) leave does first."""
    try:
        main()
    except SystemExit as stop:
        code = 0 if stop.code is None else stop.code
        if not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        leave(code)
    except Exception:
        sys.excepthook(*sys.exc_info())  # the traceback Python would print (record re-raised it)
        leave(1)
    leave(0)


if __name__ == "__main__":
    cli()

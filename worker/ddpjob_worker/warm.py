"""Pre-started trainers: the agent keeps, per local rank, one trainer process started ahead of time with the
worker's exact command line, the interpreter up and torch imported, waiting on its stdin for the environment of
its rank. When torchrun starts the workers (first start, a restart after a fault, a hot spare taking over) it
gets that process instead of a new one, so a recovery does not pay ``python`` + ``import torch`` (2-3 s on an
idle 2-core node, 7-8 s under load) between the rendezvous and the checkpoint load.

How it plugs in: torchrun starts binary workers through
``torch.distributed.elastic.multiprocessing.api.get_subprocess_handler``; ``install`` replaces that name with
``make_handler``, which hands out a waiting process (wrapped as the same SubprocessHandler type torchrun uses:
its Popen, its own session, SIGTERM to its process group on close) or falls back to torchrun's own handler. The
torch names involved, and what differs between releases, are in ddpjob_worker.compat.

The waiting process runs ``ddpjob_worker.recorded`` like any worker; ``recorded`` calls ``standby()`` first when
DDPJOB_STANDBY is set. It renames itself ``ddpjob-standby`` (fault tools skip it), asks the kernel to kill it
with the agent, imports torch, then reads one JSON line: the worker's full environment. It replaces its own
environment with it (``os.environ`` also updates the C environment that gloo/NCCL read) and runs the script.
Anything read when the interpreter starts (PYTHON*, LD_*, thread counts, visible devices) must match between the
waiting process and the worker, or the worker is started cold.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import string
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ddpjob_worker import compat, contract, procs
from ddpjob_worker.logs import get_logger

log = get_logger("warm")

#: Imported by a waiting trainer before it blocks: what every training script pays first, and what DDP's
#: constructor imports lazily (compat.DDP_LAZY_IMPORTS: 2.4-2.8 s on an idle 2-core machine otherwise).
PRELOAD = ("torch", "torch.nn", "torch.distributed", "torch.nn.parallel", "torch.utils.data",
           "torch.distributed.elastic.multiprocessing.errors", *compat.DDP_LAZY_IMPORTS)
#: Environment read when the interpreter or torch starts, not when the script runs: a worker whose values differ
#: from the waiting process's cannot use it.
STARTUP_KEYS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                "LD_PRELOAD", "LD_LIBRARY_PATH", "PATH")
STARTUP_PREFIXES = ("PYTHON",)
#: Seconds after handing a waiting process out before the next one is started: the import competes for CPU
#: with the new worker's own start (checkpoint load, first step), which is what a recovery waits for, and that
#: takes under a second once a waiting process is taken. Longer leaves the next fault without one: at 10 s a
#: second fault 5 s after the first found none and its trainer started cold (6 s more on 2 cores).
REFILL_DELAY_SECONDS = 3.0

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def enabled(environ: Mapping[str, str]) -> bool:
    """Pre-started trainers are on unless DDPJOB_WARM_TRAINERS is "0" (or "false"/"no"/"off")."""
    return environ.get(contract.DDPJOB_WARM_TRAINERS, "1").strip().lower() not in contract.WARM_TRAINERS_OFF


def startup_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of an environment that is fixed once a process has started."""
    return {k: v for k, v in environ.items() if k in STARTUP_KEYS or k.startswith(STARTUP_PREFIXES)}


def _prctl(option: int, arg: int | bytes) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(option, arg, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the standby keeps its name and outlives a killed agent
        pass


def _read_line(fd: int) -> bytes:
    """One line from ``fd`` with unbuffered reads, so nothing past it is consumed ('' at EOF)."""
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return b""
        chunks.append(chunk)
        if chunk.endswith(b"\n"):
            return b"".join(chunks)


def standby() -> None:
    """In a pre-started trainer: import torch, wait for the worker environment, install it and return (the
    caller then runs the script). Exits 0 without running anything when the agent closes the pipe instead."""
    name = procs.comm(os.getpid()).encode() or b"python"
    # Killed with the agent's (main) thread: an agent that is SIGKILLed leaves no idle trainers behind.
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    for module in PRELOAD:
        # A torch without one of them: the script imports what it needs itself, as after a cold start.
        with contextlib.suppress(ImportError):
            __import__(module)
    # The name says "ready": imports done, waiting (ps shows it; benchmarks and tests wait for it).
    _prctl(_PR_SET_NAME, contract.STANDBY_PROCESS_NAME.encode()[:15])
    line = _read_line(0)
    if not line:
        os._exit(0)
    env: dict[str, str] = json.loads(line)["env"]
    os.environ.clear()
    os.environ.update(env)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    _prctl(_PR_SET_NAME, name[:15])


class Pool:
    """The waiting trainers of one agent, one per (command line, local rank)."""

    def __init__(self) -> None:
        # (command line, local rank) -> the waiting process and the startup environment it was started with
        self._waiting: dict[tuple[tuple[str, ...], int], tuple[subprocess.Popen[bytes], dict[str, str]]] = {}
        self._wanted: dict[tuple[tuple[str, ...], int], tuple[dict[str, str], float]] = {}

    def start(self, argv: Sequence[str], local_rank: int, environ: Mapping[str, str]) -> int:
        """Start a waiting trainer for ``argv`` on ``local_rank`` with ``environ`` (its startup environment);
        return its pid."""
        key = (tuple(argv), local_rank)
        old = self._waiting.pop(key, None)
        if old is not None:
            _kill(old[0])
        env = {**environ, contract.DDPJOB_STANDBY: "1"}
        proc = subprocess.Popen(list(argv), env=env, stdin=subprocess.PIPE, start_new_session=True)
        self._waiting[key] = (proc, startup_env(environ))
        return proc.pid

    def ensure(self, argv: Sequence[str], local_rank: int, environ: Mapping[str, str]) -> None:
        """Keep the waiting trainer for ``argv``/``local_rank`` if it is alive and was started with the startup
        environment of ``environ`` (one started before the agent imported torch); start one otherwise."""
        waiting = self._waiting.get((tuple(argv), local_rank))
        if waiting is not None and waiting[0].poll() is None and waiting[1] == startup_env(environ):
            log.info("local rank %d: keeping the trainer pre-started at launch (pid %d)", local_rank,
                     waiting[0].pid)
            return
        self.start(argv, local_rank, environ)

    def keep_only(self, keys: set[tuple[tuple[str, ...], int]]) -> None:
        """Stop the waiting trainers whose (command line, local rank) is not in ``keys`` (a launch-time guess of
        torchrun's worker command that turned out wrong)."""
        for key in [k for k in self._waiting if k not in keys]:
            _kill(self._waiting.pop(key)[0])

    def take(self, argv: Sequence[str], local_rank: int, env: Mapping[str, str]) -> subprocess.Popen[bytes] | None:
        """The waiting trainer for ``argv``/``local_rank``, now given ``env``; None when there is none that can
        run it (it died, or its startup environment differs). Schedules the next one either way."""
        key = (tuple(argv), local_rank)
        self._wanted[key] = (dict(os.environ) | startup_env(env), time.monotonic() + REFILL_DELAY_SECONDS)
        waiting = self._waiting.pop(key, None)
        if waiting is None:
            return None
        proc, started_with = waiting
        if proc.poll() is not None:
            log.warning("the pre-started trainer for local rank %d exited (%s) before it was needed; starting "
                        "the worker cold", local_rank, proc.returncode)
            return None
        if started_with != startup_env(env):
            log.info("local rank %d's environment changed at startup keys; starting the worker cold", local_rank)
            _kill(proc)
            return None
        # Its name says whether its imports are done; read before it gets the environment (it renames itself back).
        ready = procs.standby_ready(proc.pid)
        try:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps({"env": dict(env)}).encode() + b"\n")
            proc.stdin.close()
        except (BrokenPipeError, OSError) as err:
            log.warning("the pre-started trainer for local rank %d is gone (%s); starting the worker cold",
                        local_rank, err)
            _kill(proc)
            return None
        log.info("local rank %d: the pre-started trainer (pid %d) takes this rank (%s)", local_rank, proc.pid,
                 "its imports were done" if ready else "still importing torch")
        return proc

    def refill(self, now: float | None = None) -> None:
        """Start the waiting trainers that are due (called from the agent's main thread: a waiting trainer dies
        with the thread that started it)."""
        now = time.monotonic() if now is None else now
        for key, (environ, due) in list(self._wanted.items()):
            if now >= due and key not in self._waiting:
                del self._wanted[key]
                self.start(key[0], key[1], environ)

    def pid(self, argv: Sequence[str], local_rank: int) -> int | None:
        """The pid of the waiting trainer for ``argv``/``local_rank``, if there is one."""
        waiting = self._waiting.get((tuple(argv), local_rank))
        return waiting[0].pid if waiting is not None else None

    def close(self) -> None:
        """Stop every waiting trainer."""
        for proc, _ in self._waiting.values():
            _kill(proc)
        self._waiting.clear()
        self._wanted.clear()


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


#: The agent's pool (one agent per process: torchrun's launcher).
POOL = Pool()
_original_handler: Callable[..., Any] | None = None


def warmable(argv: Sequence[str]) -> bool:
    """Whether ``argv`` runs under ddpjob_worker.recorded (which knows how to wait); other programs start cold."""
    return contract.RECORDED_MODULE in argv


def launch_worker_argvs(launch_argv: Sequence[str], environ: Mapping[str, str]) -> list[tuple[str, ...]]:
    """torchrun's worker command line per local rank for the launcher arguments ddp-worker builds
    (``--module ddpjob_worker.recorded SCRIPT...``), worked out without importing torch (torch's
    config_from_args: PYTHON_EXEC or this interpreter, ``-u -m``, the script's arguments with ``${local_rank}``
    substituted). Empty when the arguments or the PET_* settings are anything else, or the number of local
    ranks needs torch to count (``gpu``, ``auto``): the agent then starts its trainers after its import. A wrong
    guess costs an idle process until the agent's own check (``prestart``) stops it, not a wrong worker."""
    nproc = environ.get(contract.PET_NPROC_PER_NODE, "1")
    nproc = str(os.cpu_count() or 1) if nproc == "cpu" else nproc  # torchrun's own rule for "cpu"
    others = ("PET_NO_PYTHON", "PET_RUN_PATH", "PET_NO_USE_ENV")
    recorded = ["--module", contract.RECORDED_MODULE]
    if list(launch_argv[:2]) != recorded or not nproc.isdigit() or any(environ.get(k) for k in others):
        return []
    python = environ.get("PYTHON_EXEC", sys.executable)
    # torch's macros.substitute: string.Template, so ``$local_rank`` and ``$$`` are substituted too.
    return [(python, "-u", "-m", contract.RECORDED_MODULE,
             *[string.Template(a).safe_substitute(local_rank=str(rank)) for a in launch_argv[2:]])
            for rank in range(int(nproc))]


def prestart_at_launch(launch_argv: Sequence[str]) -> None:
    """Start the waiting trainers as the launcher starts, before it imports torch: on a replaced pod the
    trainer's import (torch + torch._dynamo) then runs beside the agent's own import and rendezvous instead of
    after them, which is most of what a replaced pod costs the group (6 s of 12.9 s on 2 cores)."""
    if not enabled(os.environ):
        return
    for local_rank, argv in enumerate(launch_worker_argvs(launch_argv, os.environ)):
        pid = POOL.start(argv, local_rank, dict(os.environ))
        log.info("local rank %d: trainer pre-started at launch (pid %d)", local_rank, pid)


def prestart(entrypoint: Any, args: Sequence[Any], local_world_size: int) -> None:
    """One waiting trainer per local rank for torchrun's worker command: the ones started at launch when they
    match it, new ones otherwise (the agent does this before its first rendezvous, so the import overlaps the
    wait for the other pods)."""
    if not enabled(os.environ) or not isinstance(entrypoint, str) or _original_handler is None:
        POOL.keep_only(set())  # off, a program that cannot wait, or a torch that cannot hand one out
        return
    wanted = [(argv, local_rank) for local_rank in range(local_world_size)
              if warmable(argv := (entrypoint, *compat.substitute_local_rank(args, local_rank)))]
    POOL.keep_only(set(wanted))
    for argv, local_rank in wanted:
        POOL.ensure(argv, local_rank, dict(os.environ))


def make_handler(entrypoint: str, args: tuple[Any, ...], env: dict[str, str], stdout: str | None,
                 stderr: str | None, local_rank_id: int, **options: Any) -> Any:
    """torchrun's get_subprocess_handler, handing out a waiting trainer when one fits. ``options`` are what this
    torch passes besides (``numa_options`` from 2.10 on), given back to its own handler as they came: torch 2.6's
    takes none, and naming one there failed every cold start."""
    assert _original_handler is not None, "warm.install() was not called"
    argv = (entrypoint, *[str(a) for a in args])
    # Redirected output and NUMA binding are set up when a process starts: those workers start cold.
    if warmable(argv) and not stdout and not stderr and options.get("numa_options") is None and enabled(os.environ):
        full = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
        proc = POOL.take(argv, local_rank_id, full)
        if proc is not None:
            return compat.adopted_handler(proc, local_rank_id)
    return _original_handler(entrypoint=entrypoint, args=args, env=env, stdout=stdout, stderr=stderr,
                             local_rank_id=local_rank_id, **options)


def install() -> None:
    """Make torchrun start binary workers through ``make_handler``."""
    global _original_handler
    original = compat.install_subprocess_handler(make_handler)
    if original is None:  # a torch that starts workers another way: they start cold, said once
        log.warning("this torch does not start workers through get_subprocess_handler: pre-started trainers are "
                    "off (update ddpjob_worker.compat)")
        return
    if original is not make_handler:
        _original_handler = original

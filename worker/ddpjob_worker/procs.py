"""Process helpers for the local runner and the tests: find a process's children, wait for a port, stop
process groups we started (Linux /proc; no psutil)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from ddpjob_worker import contract


def children(pid: int) -> list[int]:
    """Direct children of ``pid``."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            out.extend(int(x) for x in task.read_text().split())
    return out


def cmdline(pid: int) -> str:
    """The process's command line, space-joined ('' when it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


#: Set by torchrun's agent in the environment of each worker it starts; its other children (helpers) inherit the
#: agent's own environment, which lacks it.
_WORKER_MARKER = b"TORCHELASTIC_RUN_ID="


def _exec_environ(pid: int) -> list[bytes]:
    """The environment ``pid`` was exec'd with (later changes of its own environment do not show here)."""
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


def _is_torchrun_worker(pid: int) -> bool:
    """Whether ``pid`` runs with the environment torchrun gives its workers."""
    try:
        return any(entry.startswith(_WORKER_MARKER) for entry in _exec_environ(pid))
    except OSError:
        return False


def _started_as_standby(pid: int) -> bool:
    try:
        return f"{contract.DDPJOB_STANDBY}=1".encode() in _exec_environ(pid)
    except OSError:
        return False


def _reads_a_pipe(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/fd/0").startswith("pipe:")
    except OSError:
        return False


def is_standby(pid: int) -> bool:
    """Whether ``pid`` is a pre-started trainer still waiting for its rank (ddpjob_worker.warm): exec'd with
    DDPJOB_STANDBY=1 and still reading its stdin pipe (one that got its rank has /dev/null there)."""
    return _started_as_standby(pid) and _reads_a_pipe(pid)


def standby_ready(pid: int) -> bool:
    """Whether the pre-started trainer ``pid`` is done importing (it takes its standby name only then)."""
    return comm(pid) == contract.STANDBY_PROCESS_NAME


def standbys(agent_pid: int, ready: bool = False) -> list[int]:
    """The agent's pre-started trainers that wait for a rank (``ready``: only those done importing)."""
    return [c for c in children(agent_pid) if is_standby(c) and (not ready or standby_ready(c))]


def comm(pid: int) -> str:
    """The process's name (/proc/PID/comm; '' when it is gone)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def training_processes(agent_pid: int) -> list[int]:
    """The worker processes torchrun started under an agent: those it exec'd with a worker's environment, and
    pre-started trainers that got their rank (exec'd before their rank existed, so only their stdin tells).

    Picked by environment, not command line: the agent also runs short-lived helpers (``/sbin/ldconfig -p``, which
    ctypes.util.find_library runs while torch is imported; multiprocessing's tracker), and between fork and exec
    any child shows the agent's own command line. Such a pid is gone a moment later, so a caller that kills it gets
    ProcessLookupError, or kills whatever process reuses the pid. A child that has not exec'ed yet still has the
    agent's environment, so it is only counted once it is the worker."""
    return [c for c in children(agent_pid)
            if _is_torchrun_worker(c) or (_started_as_standby(c) and not _reads_a_pipe(c))]


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Block until something accepts connections on localhost:port; raise TimeoutError (or RuntimeError when
    ``proc`` exits first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process {proc.pid} exited {proc.returncode} before listening on {port}")
        with socket.socket() as s, contextlib.suppress(OSError):
            s.settimeout(0.5)
            s.connect(("127.0.0.1", port))
            return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on port {port} after {timeout}s")


def descendants(pid: int) -> list[int]:
    """Children, grandchildren, ... of ``pid`` (torchrun starts each worker in its own session, so a process
    group kill does not reach them)."""
    out: list[int] = []
    todo = children(pid)
    while todo:
        child = todo.pop()
        out.append(child)
        todo.extend(children(child))
    return out


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def stop_tree(proc: subprocess.Popen[bytes], grace: float = 10.0, also: tuple[int, ...] = ()) -> None:
    """SIGTERM ``proc`` (torchrun forwards it to its workers), wait ``grace``, then SIGKILL it, every
    descendant seen before or after, and the pids in ``also`` (workers orphaned by an earlier kill)."""
    seen = set(descendants(proc.pid)) | set(also)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
    seen |= set(descendants(proc.pid)) if proc.poll() is None else set()
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    for pid in seen:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)

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


def is_standby(pid: int) -> bool:
    """Whether ``pid`` is a pre-started trainer still waiting for its rank (ddpjob_worker.warm): started with
    DDPJOB_STANDBY=1 (the environment it was exec'd with, from its first instant) and still reading its stdin
    pipe (a trainer that got its rank has /dev/null there)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        started_as_standby = f"{contract.DDPJOB_STANDBY}=1".encode() in environ
        return started_as_standby and os.readlink(f"/proc/{pid}/fd/0").startswith("pipe:")
    except OSError:
        return False


def standbys(agent_pid: int, ready: bool = False) -> list[int]:
    """The agent's pre-started trainers that wait for a rank (``ready``: only those done importing)."""
    return [c for c in children(agent_pid) if is_standby(c) and (not ready or comm(c) == contract.STANDBY_PROCESS_NAME)]


def comm(pid: int) -> str:
    """The process's name (/proc/PID/comm; '' when it is gone)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def training_processes(agent_pid: int) -> list[int]:
    """The worker processes torchrun started under an agent (its children that are neither helper processes nor
    pre-started trainers waiting for a rank)."""
    return [c for c in children(agent_pid) if "multiprocessing" not in cmdline(c) and not is_standby(c)]


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

"""The rendezvous store stops at once on SIGTERM whichever thread the kernel hands the signal to. Python runs a
signal's handler on the main thread only when that thread wakes; serve() used to sleep 600 s at a time, so a
SIGTERM delivered to the server's thread (seen in 3 of 53 runs of a store stopped and continued) was ignored
until the pod's grace period ended in SIGKILL (issue 43 #17's teardown)."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ddpjob_worker import procs

#: tgkill(2): a signal for one thread of a process (kill(2) lets the kernel choose).
SYS_TGKILL = {"x86_64": 234, "aarch64": 131}


def tgkill(pid: int, tid: int, sig: int) -> None:
    number = SYS_TGKILL.get(os.uname().machine)
    if number is None:
        pytest.skip(f"no tgkill number for {os.uname().machine}")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, pid, tid, sig) != 0:
        raise OSError(ctypes.get_errno(), "tgkill")


def test_a_sigterm_handed_to_the_servers_thread_stops_the_store_at_once(tmp_path: Path) -> None:
    port = procs.free_port()
    with open(tmp_path / "rdzv.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "ddpjob_worker.rdzv", "--host", "127.0.0.1", "--port",
                                 str(port)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        procs.wait_for_port(port, 60, proc)
        others = [int(task.name) for task in Path(f"/proc/{proc.pid}/task").iterdir() if int(task.name) != proc.pid]
        assert others, "the store serves from a thread of its own"
        started = time.monotonic()
        tgkill(proc.pid, others[0], signal.SIGTERM)
        assert proc.wait(20) == 0
        assert time.monotonic() - started < 10  # half a second's wake-up, and a loaded machine's margin
        assert "rendezvous store stopping" in (tmp_path / "rdzv.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)

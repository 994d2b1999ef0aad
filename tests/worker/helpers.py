"""Shared helpers for the torchrun tests: a rendezvous store, agents with the pods' env contract, waiting and
teardown by PID (every process a test starts is killed in its finally)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from ddpjob_worker import contract, procs

from tests.cluster.controlplane import free_port

PY = sys.executable
#: A tiny charlm: a few seconds per run on a loaded 2-core machine.
TINY = ["--d-model", "32", "--layers", "1", "--heads", "2", "--seq-len", "32", "--batch-size", "8",
        "--seed", "7", "--log-every", "1"]


#: TCPStore's constructor releases the GIL, and pybind11 registers objects built that way in several threads at once
#: racily: the process aborts later when one is freed ("Tried to deallocate unregistered instance!", pytorch#143593,
#: pybind11#5473). Tests that give each thread its own client build them one at a time.
_STORE_INIT = threading.Lock()


def store_client(port: int, timeout: timedelta) -> Any:
    """A torch TCPStore client of 127.0.0.1:port, safe to build from several threads at once."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]  # public, re-exported from torch._C

    with _STORE_INIT:
        return TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll until ``predicate()`` is truthy; fail the test with ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


class LocalJob:
    """A rendezvous store plus agents on localhost, torn down by PID."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()  # claimed machine-wide: other pytest-xdist workers run beside this one
        self.uid = f"test-{os.getpid()}-{time.monotonic_ns()}"
        self.ckpt_dir = workdir / "checkpoints"
        self.progress = workdir / "progress.json"
        self.started: list[subprocess.Popen[bytes]] = []
        self.orphans: set[int] = set()
        (workdir / "logs").mkdir(parents=True, exist_ok=True)
        self.rdzv = self._popen([PY, "-m", "ddpjob_worker.rdzv", "--host", "127.0.0.1", "--port", str(self.port)],
                                os.environ.copy(), workdir / "logs" / "rdzv.log")
        procs.wait_for_port(self.port, 60, self.rdzv)

    def restart_store(self) -> float:
        """Stop the rendezvous store as a pod deletion does (SIGTERM) and start an empty one on the same port, as
        the operator does behind the same Service name; returns when the old one was stopped."""
        self.rdzv.terminate()
        self.rdzv.wait(30)
        stopped = time.time()
        self.start_store()
        return stopped

    def start_store(self) -> None:
        """Start an empty store on the job's port (after the old one was stopped); returns once it listens."""
        self.rdzv = self._popen([PY, "-m", "ddpjob_worker.rdzv", "--host", "127.0.0.1", "--port", str(self.port)],
                                os.environ.copy(), self.workdir / "logs" / "rdzv.log")
        procs.wait_for_port(self.port, 60, self.rdzv)

    def _popen(self, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as f:
            proc = subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    cwd=self.workdir)
        self.started.append(proc)
        return proc

    def env(self, index: int, nnodes: str = "2", max_restarts: int = 3, **extra: str) -> dict[str, str]:
        lo, _, hi = nnodes.partition(":")
        worker = contract.WorkerEnv(
            job_name="t", namespace="local", job_uid=self.uid, worker_index=index, min_nodes=int(lo),
            max_nodes=int(hi or lo), nproc_per_node="1", rdzv_endpoint=f"127.0.0.1:{self.port}",
            max_restarts=max_restarts, checkpoint_dir=str(self.ckpt_dir), progress_file=str(self.progress),
            rdzv_conf="is_host=false,last_call_timeout=1,join_timeout=120", sigterm_budget_seconds=30,
        )
        return {**os.environ, **worker.to_env(), "OMP_NUM_THREADS": "1", contract.DDPJOB_DNS_WAIT_SECONDS: "5",
                **extra}

    def agent(self, index: int, command: list[str], **env_kw: Any) -> subprocess.Popen[bytes]:
        """A ddp-worker agent (what a worker pod runs) with ``command`` as the container args."""
        return self._popen([PY, "-m", "ddpjob_worker.entrypoint", "--", *command], self.env(index, **env_kw),
                           self.log(index))

    def log(self, index: int) -> Path:
        return self.workdir / "logs" / f"worker-{index}.log"

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted((self.workdir / "logs").glob("*.log")))

    def tails(self, chars: int = 3000) -> str:
        """The last ``chars`` of each process's log, each under its name: for an assertion's message, where the
        tail of all logs joined would show only the last agent's (an exit 200 of worker 0 once came with worker 1's
        log alone, and CI keeps nothing but its output)."""
        parts = []
        for log in sorted((self.workdir / "logs").glob("*.log")):
            text = log.read_text(errors="replace")
            cut = f"[... {len(text) - chars} characters left out]\n" if len(text) > chars else ""
            parts.append(f"--- {log.name} ---\n{cut}{text[-chars:]}")
        return "\n".join(parts)

    def training_pid(self, agent: subprocess.Popen[bytes], timeout: float = 60) -> int:
        pids = wait_until(lambda: procs.training_processes(agent.pid), timeout, "the agent's training process")
        self.orphans.update(pids)
        return int(pids[0])

    def progress_at_least(self, step: int, timeout: float) -> dict[str, Any]:
        result: dict[str, Any] = wait_until(
            lambda: (p := read_json(self.progress)) and p.get("globalStep", -1) >= step and p, timeout,
            f"global step {step}")
        return result

    def close(self) -> None:
        for proc in reversed(self.started):
            self.orphans.update(procs.descendants(proc.pid))
        for proc in reversed(self.started):
            procs.stop_tree(proc, grace=3, also=tuple(self.orphans))


def wait_exit(proc: subprocess.Popen[bytes], timeout: float, job: LocalJob) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        logs = job.tails()
        raise AssertionError(f"process {proc.pid} still running after {timeout}s; logs:\n{logs}") from None

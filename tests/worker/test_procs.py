"""procs.training_processes finds torchrun's workers among an agent's children, and nothing else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from ddpjob_worker import procs

#: Stands in for an agent: one child with the environment torchrun gives a worker, one helper without it (like the
#: ``/sbin/ldconfig -p`` that importing torch runs), both with the same command line; prints the worker's pid.
_AGENT = """
import os, subprocess, sys, time
sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
worker = subprocess.Popen(sleep, env={**os.environ, "TORCHELASTIC_RUN_ID": "job"})
subprocess.Popen(sleep, env={k: v for k, v in os.environ.items() if k != "TORCHELASTIC_RUN_ID"})
print(worker.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.timeout(60)
def test_training_processes_are_the_children_with_a_workers_environment() -> None:
    agent = subprocess.Popen([sys.executable, "-c", _AGENT], stdout=subprocess.PIPE, text=True)
    try:
        assert agent.stdout is not None
        worker = int(agent.stdout.readline())
        assert len(procs.children(agent.pid)) == 2
        assert procs.training_processes(agent.pid) == [worker]
    finally:
        for pid in procs.descendants(agent.pid):
            os.kill(pid, signal.SIGKILL)
        agent.kill()
        agent.wait()

"""The checkpoint library's SIGTERM handling (ddpjob_worker.preemption), in a process of its own: the handler notes
the signal, gives it back to the previous handler on ``uninstall``, and the budget's watchdog exits 143 when no
final checkpoint ends the process first."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import os, signal, time
    import torch
    from ddpjob_worker.preemption import EXIT_AFTER_SIGTERM, Preemption

    seen = []
    signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    preemption = Preemption(3, lambda: 1.0, torch.device("cpu"), distributed=False)
    preemption.install()
    assert not preemption.anywhere() and preemption.since is None
    os.kill(os.getpid(), signal.SIGTERM)
    while preemption.since is None:  # the handler runs in the main thread, between two bytecodes
        time.sleep(0.01)
    assert preemption.anywhere()
    preemption.uninstall()
    os.kill(os.getpid(), signal.SIGTERM)
    while not seen:
        time.sleep(0.01)
    assert EXIT_AFTER_SIGTERM == 143
    print("handled", flush=True)
    time.sleep(60)  # the watchdog ends the process after the 1 s budget
""")


def test_sigterm_is_noted_handed_back_and_bounded_by_the_budget() -> None:
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", SCRIPT], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.stdout.strip() == "handled", proc.stderr[-3000:]
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert "[ddpjob rank=3] SIGTERM: finishing the current step, then checkpointing (budget 1s)" in proc.stderr
    assert "[ddpjob rank=3] SIGTERM budget of 1s exceeded; exiting 143 without a final checkpoint" in proc.stderr

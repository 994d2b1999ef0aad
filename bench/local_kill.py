"""Benchmark (not a test): seconds from kill -9 of a trainer to the first training step after it, with two local
agents (no Kubernetes), N kills spaced S seconds, the agents' logs kept for a look at where the time went.

    .venv/bin/python bench/local_kill.py --kills 4 --spacing 9 [--workdir DIR] [--loglevel INFO]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.worker.helpers import TINY, LocalJob  # noqa: E402


def logged(line: str) -> float:
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=4)
    parser.add_argument("--spacing", type=float, default=9.0, help="seconds between kills")
    parser.add_argument("--workdir", type=Path, help="keep the logs here (default: a temporary folder)")
    parser.add_argument("--loglevel", default="WARNING", help="torchrun's LOGLEVEL in the agents")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="ddpjob-local-kill-"))
    job = LocalJob(workdir)
    steps = int((args.kills + 2) * args.spacing / 0.12) + 100
    command = ["python", "-m", "ddpjob_worker.examples.charlm", *TINY, "--epochs", "1", "--steps-per-epoch",
               str(steps), "--checkpoint-every", "5", "--step-delay", "0.1"]
    kills: list[float] = []
    try:
        agents = [job.agent(i, command, LOGLEVEL=args.loglevel) for i in range(2)]
        job.progress_at_least(10, 300)
        for k in range(args.kills):
            time.sleep(args.spacing)
            pid = job.training_pid(agents[k % 2])
            kills.append(time.time())
            os.kill(pid, signal.SIGKILL)
        time.sleep(8)
    finally:
        job.close()
    lines = (workdir / "logs" / "worker-0.log").read_text().splitlines()
    resumed = [logged(x) for x in lines if "resumed from checkpoint" in x]
    stepped = [logged(x) for x in lines if "charlm: epoch" in x]
    for at in kills:
        back = next((t for t in resumed if t > at), None)
        first = next((t for t in stepped if back is not None and t > back), None)
        print(f"kill -9 -> resumed {back - at:.2f} s, first step {first - at:.2f} s" if back and first
              else "kill -9 -> no resume logged")
    print(f"load average {os.getloadavg()[0]:.1f}; logs in {workdir / 'logs'}")


if __name__ == "__main__":
    main()

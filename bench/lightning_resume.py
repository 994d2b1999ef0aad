"""Does PyTorch Lightning resume exactly, alone (no ddpjob, no torchrun, one process)? Runs the e2e tier's Lightning
script (tests/e2e/scripts/frameworks/lightning_train.py: ModelCheckpoint every 10 steps, each on an epoch's last
batch, ``fit(ckpt_path="last")``) without faults, then once per kill sequence: kill -9 at each listed step, start
again (it resumes from last.ckpt), and compares the final parameters with the run without faults.

Seen 2026-12-06 (Lightning 2.6.6, torch 2.6.0): one resume ends equal; a second one never does (nor with
shuffle=False in a copy of the script).
A run resumed from a checkpoint saved on an epoch's last batch writes its later checkpoints with epoch progress
counters ``ready``/``started`` one behind (fit_loop.on_advance_start skips their increment while it restarts mid
epoch); resumed from one of those, no restart stage of fit_loop.update_restart_stage matches and the epoch after it
trains on other batches (docs/checkpoints.md, "Lightning").

    python bench/lightning_resume.py [--script PATH] [--steps 40] [--kills 15 25 15,25 25,35]

Needs lightning and torch (the frameworks image has both: docker run --rm -v "$PWD/bench:/bench"
ddpjob-frameworks:torch-2.6.0 python /bench/lightning_resume.py --script /app/lightning_train.py).
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = HERE.parent / "tests" / "e2e" / "scripts" / "frameworks" / "lightning_train.py"


def run(script: Path, out: Path, steps: int, kills: list[int]) -> tuple[str | None, list[str]]:
    """Final parameters' sha256 and the checkpoint each start resumed from."""
    shutil.rmtree(out, ignore_errors=True)
    final, resumed = None, []
    for kill_at in [*kills, None]:
        cmd = [sys.executable, str(script), "--out", str(out), "--steps", str(steps), "--save-every", "10",
               "--step-sleep", "0.02"]
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                if (m := re.search(r"RESUMED_FROM=(\S+)", line)):
                    resumed.append(Path(m[1]).name)
                if (m := re.search(r"FINAL_PARAMS_SHA256=(\S+)", line)):
                    final = m[1]
                if kill_at is not None and (m := re.search(r"\] step (\d+)/", line)) and int(m[1]) >= kill_at:
                    proc.send_signal(signal.SIGKILL)
                    break
    return final, resumed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--script", type=Path, default=SCRIPT)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--kills", nargs="+", default=["15", "25", "15,25", "25,35"],
                        help="kill sequences: steps joined by commas")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        reference, _ = run(args.script, Path(tmp) / "ref", args.steps, [])
        print(f"uninterrupted: {reference}")
        print(f"{'kill -9 at steps':<18} {'resumed from':<40} equal")
        for spec in args.kills:
            kills = [int(s) for s in spec.split(",")]
            final, resumed = run(args.script, Path(tmp) / "k", args.steps, kills)
            print(f"{spec:<18} {', '.join(resumed[1:]):<40} {final == reference}")


if __name__ == "__main__":
    main()

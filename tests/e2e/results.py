"""The e2e training runs' numbers over a session: kept in $TMPDIR/ddpjob-e2e-results.json (rewritten after every
run, so a crash keeps what was measured) and shown in pytest's terminal summary."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

RESULTS_FILE = Path(os.environ.get("DDPJOB_E2E_RESULTS", Path(tempfile.gettempdir()) / "ddpjob-e2e-results.json"))
RESULTS: dict[str, Any] = {}


def record(run: str, **data: Any) -> None:
    """Keep one run's numbers; the file is rewritten after every run so a crash keeps what was measured."""
    RESULTS[run] = data
    RESULTS_FILE.write_text(json.dumps(RESULTS, indent=2, sort_keys=True) + "\n")


def summary_lines() -> list[str]:
    """The session's runs, and the soak's faults, for pytest's terminal summary."""
    if not RESULTS:
        return []
    lines = [f"ddpjob e2e training runs (also in {RESULTS_FILE}):",
             f"  {'run':<16} {'wall s':>7} {'incidents':>9} {'goodput':>8}  params"]
    for run, d in RESULTS.items():
        goodput = d.get("goodput")
        lines.append(f"  {run:<16} {d.get('wall_seconds', 0):>7.1f} {d.get('incidents', 0)!s:>9} "
                     f"{'-' if goodput is None else f'{goodput:.2f}':>8}  {d.get('params', '')}")
    for run, d in RESULTS.items():
        if not d.get("faults"):
            continue
        lines.append(f"  {run} faults: {'fault':<58} {'incidents':>9} {'recovery s':>10} {'lost s':>7}")
        for n, f in enumerate(d["faults"], start=1):
            lines.append(f"    {n:>2} {f.get('fault', ''):<58} {f.get('incidents', '-')!s:>9} "
                         f"{f.get('recovery_s') or '-'!s:>10} {f.get('lost_s') or '-'!s:>7}")
    return lines

"""Prints the timing table of a `make test` (or `make demo`) run from the lines hack/timed.sh, hack/install-tools.sh
and the test suites' conftest appended to DDPJOB_TIMINGS ("phase<TAB>seconds<TAB>exit code"), in the order they ran.

usage: python hack/timings.py FILE [--since EPOCH_SECONDS] [--what "make demo"]
"""

from __future__ import annotations

import sys
from pathlib import Path


def rows(path: Path) -> list[tuple[str, float, str]]:
    """(phase, seconds, status) for every well-formed line of ``path``."""
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        parts = line.rstrip("\n").split("\t")
        if len(parts) >= 2:
            try:
                out.append((parts[0], float(parts[1]), parts[2] if len(parts) > 2 else ""))
            except ValueError:
                continue
    return out


def clock(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}:{rest:02d}"


def table(found: list[tuple[str, float, str]], wall: float | None, what: str = "make test") -> str:
    """The table: one row a phase; the rows of what a phase did (a build inside `tools`, a test inside
    `tests/e2e`) are indented and not added to the sum."""
    width = max([len(p) for p, _, _ in found] + [len("phase")])
    lines = [f"{'phase':<{width}}  {'seconds':>8}  {'m:ss':>6}  exit", "-" * (width + 26)]
    pending: list[str] = []  # a phase writes its own row when it ends, after the rows of what it did
    for phase, seconds, status in found:
        row = f"{phase:<{width}}  {seconds:>8.1f}  {clock(seconds):>6}  {status}"
        if phase.startswith(" "):
            pending.append(row)
        else:
            lines += [row, *pending]
            pending = []
    lines += pending
    # A phase marked "*" ran beside another (hack/test.sh): its time is inside the wall clock of the other.
    top = sum(s for p, s, _ in found if not p.startswith(" ") and not p.endswith("*"))
    lines.append("-" * (width + 26))
    lines.append(f"{'sum of top-level phases':<{width}}  {top:>8.1f}  {clock(top):>6}")
    if any(p.endswith("*") for p, _, _ in found):
        lines.append("* ran beside the phases around it; not in the sum")
    if wall is not None:
        lines.append(f"{what + ', wall':<{width}}  {wall:>8.1f}  {clock(wall):>6}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    import argparse
    import time

    parser = argparse.ArgumentParser(usage=__doc__)
    parser.add_argument("file", type=Path)
    parser.add_argument("--since", type=float, help="the run's start (epoch seconds): adds its wall-clock time")
    parser.add_argument("--what", default="make test", help="what ran, for the wall-clock row")
    args = parser.parse_args(argv)
    wall = None if args.since is None else time.time() - args.since
    print(f"\n== timing table ({args.file}) ==")
    print(table(rows(args.file), wall, args.what))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Sample accounting of an elastic run (issue 27), shared by the torchrun test and the e2e test: each rank's
records of the sample indices it consumed per step (JSON lines: step, epoch, world, group, indices)."""

from __future__ import annotations

from collections import Counter
from typing import Any

Record = dict[str, Any]


def committed(recs: list[Record]) -> dict[int, list[Record]]:
    """Each step's records from the last group that did it (an earlier group's record of a step was replayed when
    that group did not checkpoint it before it ended)."""
    by_step: dict[int, list[Record]] = {}
    for r in recs:
        by_step.setdefault(r["step"], []).append(r)
    out = {}
    for step, rs in by_step.items():
        last = max(float(r["group"]) for r in rs)
        out[step] = [r for r in rs if float(r["group"]) == last]
    return out


def world_changes(kept: dict[int, list[Record]]) -> list[int]:
    """The world sizes the kept steps ran with, each change once: [2, 3, 1, 2]."""
    worlds = [kept[s][0]["world"] for s in sorted(kept)]
    return [w for i, w in enumerate(worlds) if i == 0 or worlds[i - 1] != w]


def seen(kept: dict[int, list[Record]], epoch: int | None = None) -> Counter[int]:
    """How often each index was consumed by the kept steps (of ``epoch``, or all)."""
    return Counter(i for rs in kept.values() for r in rs if epoch is None or r["epoch"] == epoch
                   for i in r["indices"])


def step_sets(kept: dict[int, list[Record]]) -> dict[int, frozenset[int]]:
    """Each kept step's indices, all ranks together."""
    return {step: frozenset(i for r in rs for i in r["indices"]) for step, rs in kept.items()}

"""The checkpoint write and load durations a job's progress reports, into the operator's histograms once each."""

from __future__ import annotations

from typing import Any

import pytest
from ddpjob_operator.metrics import registry as metrics
from prometheus_client import REGISTRY

T0, T1 = "2026-11-27T10:00:00Z", "2026-11-27T10:00:30Z"


def _counts() -> tuple[float, float]:
    return (REGISTRY.get_sample_value("ddpjob_checkpoint_save_seconds_count") or 0.0,
            REGISTRY.get_sample_value("ddpjob_checkpoint_load_seconds_count") or 0.0)


def _save(step: int, at: str, seconds: float | None = 0.5) -> dict[str, Any]:
    return {"lastCheckpoint": {"step": step, "time": at, **({"seconds": seconds} if seconds is not None else {})}}


def _load(loaded: str, seconds: float = 2.0, rdzv: str = T0) -> dict[str, Any]:
    return {"start": {"rendezvousTime": rdzv, "checkpointLoadedTime": loaded, "checkpointLoadSeconds": seconds}}


@pytest.mark.parametrize(("reports", "saves", "loads"), [
    pytest.param([{}], 0, 0, id="nothing reported"),
    pytest.param([_save(5, T0)], 1, 0, id="one write"),
    pytest.param([_save(5, T0), _save(5, T0), _save(5, T0)], 1, 0, id="the same write in three reports: once"),
    pytest.param([_save(5, T0), _save(10, T1)], 2, 0, id="two writes"),
    pytest.param([_save(5, T0, None)], 0, 0, id="a script that does not measure its writes"),
    pytest.param([_load(T0), _load(T0)], 0, 1, id="one load in two reports: once"),
    # A new group announces its rendezvous before its own load: the previous group's figure is still there.
    pytest.param([_load(T0), _load(T0, rdzv=T1), _load(T1, 3.0, rdzv=T1)], 0, 2, id="a new group's load"),
    pytest.param([{**_save(5, T0), **_load(T0)}], 1, 1, id="both in one report"),
    pytest.param([{"lastCheckpoint": "junk", "start": ["junk"]}], 0, 0, id="malformed: ignored"),
])
def test_each_write_and_load_is_observed_once(reports: list[dict[str, Any]], saves: int, loads: int) -> None:
    seen: dict[str, object] = {}
    before = _counts()
    for progress in reports:
        metrics.observe_checkpoints(progress, seen)
    after = _counts()
    assert (after[0] - before[0], after[1] - before[1]) == (saves, loads)


def test_the_observed_seconds_land_in_the_histogram() -> None:
    before = REGISTRY.get_sample_value("ddpjob_checkpoint_save_seconds_sum") or 0.0
    metrics.observe_checkpoints(_save(7, T1, 12.5), {})
    assert (REGISTRY.get_sample_value("ddpjob_checkpoint_save_seconds_sum") or 0.0) - before == 12.5



JUNK = [float("nan"), float("inf"), -1.0, -0.001, 1e12, True, "3"]


def _samples(*names: str, labels: dict[str, str] | None = None) -> list[float]:
    """The histograms' _count and _sum (a NaN observed leaves the count and poisons the sum for good)."""
    return [REGISTRY.get_sample_value(f"{name}_{part}", labels or {}) or 0.0 for name in names
            for part in ("count", "sum")]


@pytest.mark.parametrize("junk", JUNK, ids=repr)
def test_a_figure_no_clock_measured_is_not_observed(junk: object) -> None:
    """status.progress is written by worker pods: a NaN, a negative or an absurd figure must not skew (or, for
    NaN, poison the _sum of) the histograms. Each report names a new write and load, so only the value decides."""
    names = ("ddpjob_checkpoint_save_seconds", "ddpjob_checkpoint_load_seconds")
    before = _samples(*names)
    metrics.observe_checkpoints({**_save(5, T0, junk), **_load(T1, junk)}, {})  # type: ignore[arg-type]
    assert _samples(*names) == before


@pytest.mark.parametrize("junk", JUNK, ids=repr)
def test_a_recovery_figure_no_clock_measured_is_not_observed(junk: object) -> None:
    def samples() -> list[float]:
        return [*_samples("ddpjob_recovery_seconds"),
                *_samples("ddpjob_recovery_phase_seconds", labels={"phase": "rendezvous"})]

    before = samples()
    metrics.observe_recovery({"recoverySeconds": junk, "phases": {"rendezvous": junk}})
    assert samples() == before
    metrics.observe_recovery({"recoverySeconds": 4, "phases": {"rendezvous": 1.5}})
    assert samples() == [before[0] + 1, before[1] + 4, before[2] + 1, before[3] + 1.5]

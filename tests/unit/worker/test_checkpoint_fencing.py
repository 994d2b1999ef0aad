"""Stale writers, in one process: an earlier Checkpointer on the same directory plays the pod that was cut off from
the job while it kept running (a network partition), the next one plays the job's new start on the other nodes."""

from __future__ import annotations

import json
import logging
import shutil
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from ddpjob_worker.checkpoint import CheckpointConfig, Checkpointer, TrainState, capture_rng
from ddpjob_worker.storage import MARKER, LocalStorage, Manifest


def make(tmp_path: Path, storage: LocalStorage | None = None, **config: Any) -> tuple[Checkpointer, torch.nn.Linear]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    ckpt = Checkpointer(CheckpointConfig(directory=str(tmp_path), handle_sigterm=False, **config), model=model,
                        storage=storage)
    return ckpt, model


def step_to(ckpt: Checkpointer, model: torch.nn.Linear, step: int) -> None:
    """Train to ``step`` (the weights say which step they belong to) and save."""
    with torch.no_grad():
        model.weight.fill_(float(step))
    ckpt.save(TrainState(global_step=step))


def marker(tmp_path: Path, step: int) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((tmp_path / f"step-{step}" / MARKER).read_text())
    return result


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    logging.getLogger("ddpjob").addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        logging.getLogger("ddpjob").removeHandler(caplog.handler)


def test_a_stale_writers_late_checkpoint_is_never_resumed_from(tmp_path: Path,
                                                               logs: pytest.LogCaptureFixture) -> None:
    first, model1 = make(tmp_path)
    first.resume()
    step_to(first, model1, 5)
    step_to(first, model1, 10)
    # The pod running `first` is cut off; the job starts again on the other nodes and resumes from step 10.
    second, model2 = make(tmp_path)
    assert second.resume().global_step == 10
    step_to(second, model2, 15)
    # The cut-off pod finishes a save it had begun. Its check before committing ran before the new start was
    # recorded (the race that check cannot close), so step 20 is committed.
    stale = first.storage.write(20, first._state_dict(TrainState(global_step=20), [capture_rng()]),
                                {"world_size": 1, "incarnation": 1})
    assert isinstance(stale, Manifest) and (tmp_path / "step-20" / MARKER).is_file()

    third, model3 = make(tmp_path)
    assert third.resume().global_step == 15
    assert float(model3.weight.detach()[0, 0]) == 15.0
    assert "checkpoint step-20" in logs.text and "is stale" in logs.text
    assert "committed by incarnation 1 after incarnation 2 resumed from step-10" in logs.text
    assert not (tmp_path / "step-20").exists() and list(tmp_path.glob("stale-step-20-*"))


def test_a_stale_writer_commits_nothing_once_the_new_start_is_recorded(tmp_path: Path,
                                                                       logs: pytest.LogCaptureFixture) -> None:
    first, model1 = make(tmp_path)
    first.resume()
    step_to(first, model1, 10)
    second, model2 = make(tmp_path)
    second.resume()
    step_to(second, model2, 15)
    with pytest.raises(RuntimeError, match="saving a checkpoint failed") as raised:
        step_to(first, model1, 15)  # would replace the new start's step 15 with the old one's
    assert "fenced by incarnation 2" in str(raised.value.__cause__)
    assert "checkpoint step-15 not committed: fenced by incarnation 2" in logs.text
    assert marker(tmp_path, 15)["meta"]["incarnation"] == 2
    assert not list(tmp_path.glob(".tmp-*"))
    third, model3 = make(tmp_path)
    assert third.resume().global_step == 15 and float(model3.weight.detach()[0, 0]) == 15.0


class GatedStorage(LocalStorage):
    """A volume whose writes wait until ``gate`` opens: a save in flight while the pod is cut off."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.gate = threading.Event()

    def write(self, step: int, state: Mapping[str, Any], meta: Mapping[str, Any], **kwargs: Any) -> Manifest:
        assert self.gate.wait(30)
        return super().write(step, state, meta, **kwargs)


def test_an_async_save_in_flight_when_the_pod_is_cut_off_is_not_committed(tmp_path: Path) -> None:
    first, model1 = make(tmp_path, storage=GatedStorage(tmp_path), async_save=True)
    first.resume()
    assert isinstance(first.storage, GatedStorage)
    first.storage.gate.set()
    step_to(first, model1, 10)
    first.wait()
    first.storage.gate.clear()
    step_to(first, model1, 20)  # the background writer waits at the gate
    second, _ = make(tmp_path)
    assert second.resume().global_step == 10
    first.storage.gate.set()
    with pytest.raises(RuntimeError) as raised:
        first.wait()
    assert "fenced by incarnation 2" in str(raised.value.__cause__)
    assert LocalStorage(tmp_path).committed_steps() == [10]


def test_rotation_never_counts_a_stale_checkpoint(tmp_path: Path) -> None:
    first, model1 = make(tmp_path, keep=2)
    first.resume()
    step_to(first, model1, 5)
    step_to(first, model1, 10)
    second, model2 = make(tmp_path, keep=2)
    second.resume()
    step_to(second, model2, 15)
    first.storage.write(20, {"x": torch.zeros(1)}, {"world_size": 1, "incarnation": 1})  # the stale writer's
    step_to(second, model2, 16)
    # keep=2 valid ones (16, 15); step 20 is neither counted nor deleted, resume sets it aside
    assert LocalStorage(tmp_path).committed_steps() == [20, 16, 15]
    third, _ = make(tmp_path, keep=2)
    assert third.resume().global_step == 16
    assert LocalStorage(tmp_path).committed_steps() == [16, 15]


def test_a_save_without_resume_starts_a_history_of_its_own(tmp_path: Path) -> None:
    old, model = make(tmp_path)
    step_to(old, model, 100)  # an earlier run left a higher step behind
    fresh, model = make(tmp_path)
    step_to(fresh, model, 3)  # a script that never resumes
    assert [marker(tmp_path, step)["meta"].get("incarnation") for step in (100, 3)] == [1, 2]
    assert make(tmp_path)[0].resume().global_step == 3


def test_checkpoints_from_before_fencing_still_load(tmp_path: Path) -> None:
    ckpt, model = make(tmp_path)
    step_to(ckpt, model, 6)
    step_to(ckpt, model, 7)
    # What a volume written before fencing holds: no fence records, no incarnation in the markers.
    shutil.rmtree(tmp_path / "fence", ignore_errors=True)
    for step in (6, 7):
        raw = marker(tmp_path, step)
        raw["meta"] = {"world_size": 1}
        (tmp_path / f"step-{step}" / MARKER).write_text(json.dumps(raw))

    ckpt, model = make(tmp_path)
    assert ckpt.resume().global_step == 7 and float(model.weight.detach()[0, 0]) == 7.0
    assert ckpt.incarnation == 1
    assert sorted(p.name for p in (tmp_path / "fence").iterdir()) == ["incarnation-1-resumed-from-7.json"]
    step_to(ckpt, model, 8)
    assert marker(tmp_path, 8)["meta"] == {"world_size": 1, "incarnation": 1}
    assert LocalStorage(tmp_path).committed_steps() == [8, 7, 6]  # the old ones stay valid
    assert make(tmp_path)[0].resume().global_step == 8

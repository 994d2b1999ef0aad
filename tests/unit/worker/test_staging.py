"""The host copy behind asynchronous saves: taken at save time, reused between saves, bounded by the state's size."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ddpjob_worker.checkpoint import CheckpointConfig, Checkpointer, TrainState
from ddpjob_worker.staging import StagingBuffers
from ddpjob_worker.storage import LocalStorage


def state() -> dict[str, object]:
    weight = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    return {"model": {"weight": weight, "tied": weight, "steps": torch.tensor(3)}, "lr": [0.1, 0.01], "name": "x"}


def test_the_copy_is_taken_at_stage_time() -> None:
    live = state()
    staged = StagingBuffers().stage(live)
    live["model"]["weight"].add_(100.0)  # type: ignore[index]
    live["lr"].append(0.001)  # type: ignore[attr-defined]
    assert torch.equal(staged["model"]["weight"], torch.arange(6, dtype=torch.float32).reshape(2, 3))
    assert staged["lr"] == [0.1, 0.01] and staged["name"] == "x"


def test_buffers_are_reused_and_hold_one_copy_of_the_state() -> None:
    buffers = StagingBuffers()
    first = buffers.stage(state())
    pointer = first["model"]["weight"].data_ptr()
    second = buffers.stage(state())
    assert second["model"]["weight"].data_ptr() == pointer  # no new allocation on the next save
    assert second["model"]["tied"] is second["model"]["weight"]  # tied weights stay one tensor
    assert buffers.nbytes == 6 * 4 + 8  # weight once (tied), plus the int64 step counter


def test_tied_weights_stay_one_tensor_as_in_a_synchronous_save() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    model[1].weight = model[0].weight
    live = model.state_dict()
    assert live["0.weight"] is not live["1.weight"]  # each entry is its own detach() of the one parameter
    staged = StagingBuffers().stage(live)
    assert staged["1.weight"] is staged["0.weight"] and staged["1.bias"] is not staged["0.bias"]


def test_a_state_dict_keeps_its_module_versions() -> None:
    live = torch.nn.BatchNorm1d(3).state_dict()
    staged = StagingBuffers().stage({"model": live})["model"]
    assert type(staged) is type(live) and staged._metadata == live._metadata  # type: ignore[attr-defined]


def test_buffers_follow_the_state_when_it_changes() -> None:
    buffers = StagingBuffers()
    buffers.stage({"a": torch.zeros(1000), "b": torch.zeros(10)})
    staged = buffers.stage({"a": torch.ones(20, dtype=torch.float64)})
    assert staged["a"].dtype == torch.float64 and torch.equal(staged["a"], torch.ones(20, dtype=torch.float64))
    assert buffers.nbytes == 20 * 8  # the old buffers of "a" and "b" were let go


def test_async_saves_reuse_the_staging_copy_and_keep_each_step_intact(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2)
    ckpt = Checkpointer(CheckpointConfig(directory=str(tmp_path), handle_sigterm=False, async_save=True), model=model)
    for step in (1, 2):
        with torch.no_grad():
            model.weight.fill_(float(step))
        ckpt.save(TrainState(global_step=step))
    assert ckpt._background is not None
    model_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    assert model_bytes < ckpt._background.staging.nbytes < model_bytes + (16 << 10)  # plus the RNG states' tensors
    ckpt.close()
    assert ckpt._background is None  # close frees the buffers
    storage = LocalStorage(tmp_path)
    for step in (1, 2):
        assert storage.verify(step) is None
        assert float(storage.read(step, "cpu", verify=True)["model"]["weight"][0, 0]) == float(step)


def test_large_buffers_round_trip_through_torch_save(tmp_path: Path) -> None:
    big = torch.rand(3 << 20)  # 12 MB: a huge-page buffer where the kernel has them
    buffers = StagingBuffers()
    staged = buffers.stage({"big": big, "small": torch.ones(3)})
    assert buffers.stage({"big": big, "small": torch.ones(3)})["big"].data_ptr() == staged["big"].data_ptr()
    torch.save(staged, tmp_path / "state.pt")
    loaded = torch.load(tmp_path / "state.pt", weights_only=True)
    assert torch.equal(loaded["big"], big) and torch.equal(loaded["small"], torch.ones(3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_are_staged_into_reused_pinned_memory() -> None:
    live = {"w": torch.rand(3 << 20, device="cuda"), "b": torch.rand(7, device="cuda")}
    buffers = StagingBuffers()
    staged = buffers.stage(live)
    assert all(t.device.type == "cpu" and t.is_pinned() for t in staged.values())
    assert all(torch.equal(staged[k], live[k].cpu()) for k in live)  # the copies landed before stage returned
    live["w"].add_(1.0)
    again = buffers.stage(live)
    assert again["w"].data_ptr() == staged["w"].data_ptr() and torch.equal(again["w"], live["w"].cpu())

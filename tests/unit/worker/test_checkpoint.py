"""The checkpoint library in one process: atomic step folders, checksums, fallback, rotation, exact state."""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from ddpjob_worker.checkpoint import CheckpointConfig, Checkpointer, TrainState
from ddpjob_worker.sampler import ResumableDistributedSampler
from ddpjob_worker.storage import MARKER, PAYLOAD, LocalStorage, file_sha256


def make(tmp_path: Path, **config: object) -> tuple[Checkpointer, torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    ckpt = Checkpointer(CheckpointConfig(directory=str(tmp_path), handle_sigterm=False, **config),  # type: ignore[arg-type]
                        model=model, optimizer=opt, lr_scheduler=sched)
    return ckpt, model, opt


def train(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    loss = model(torch.randn(3, 4)).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()


def test_save_and_resume_restore_model_optimizer_scheduler_rng_exactly(tmp_path: Path) -> None:
    ckpt, model, opt = make(tmp_path)
    train(model, opt)
    ckpt.save(TrainState(epoch=1, step_in_epoch=3, global_step=7, extra={"best": 0.5}))
    assert ckpt.last_saved_step == 7 and ckpt.last_save_seconds is not None and ckpt.last_save_seconds > 0
    expected_params = [p.clone() for p in model.parameters()]
    expected_rng = (random.random(), float(np.random.rand()), torch.rand(1))

    ckpt2, model2, opt2 = make(tmp_path)
    state = ckpt2.resume()
    assert ckpt2.last_load_seconds is not None and ckpt2.last_load_seconds > 0  # what progress reports
    assert (state.epoch, state.step_in_epoch, state.global_step, state.extra) == (1, 3, 7, {"best": 0.5})
    assert all(torch.equal(a, b) for a, b in zip(expected_params, model2.parameters(), strict=True))
    assert opt2.state_dict()["state"][0]["step"] == 1  # AdamW moments came back
    assert opt2.param_groups[0]["lr"] == 0.1
    assert (random.random(), float(np.random.rand()), torch.rand(1)) == expected_rng


def test_fresh_start_without_checkpoints(tmp_path: Path) -> None:
    ckpt, _, _ = make(tmp_path / "empty")
    assert ckpt.resume() == TrainState()
    assert ckpt.last_load_seconds is None  # nothing loaded: no load figure


def test_flipped_byte_is_detected_logged_and_the_previous_checkpoint_used(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ckpt, model, opt = make(tmp_path)
    ckpt.save(TrainState(global_step=1))
    train(model, opt)
    ckpt.save(TrainState(global_step=2))
    payload = tmp_path / "step-2" / PAYLOAD
    data = bytearray(payload.read_bytes())
    data[len(data) // 2] ^= 0x01
    payload.write_bytes(bytes(data))

    ckpt2, _, _ = make(tmp_path)
    logging.getLogger("ddpjob").addHandler(caplog.handler)
    try:
        assert ckpt2.resume().global_step == 1
    finally:
        logging.getLogger("ddpjob").removeHandler(caplog.handler)
    assert "checkpoint step-2" in caplog.text and "checksum mismatch" in caplog.text
    assert "falling back to the previous valid checkpoint" in caplog.text
    assert not (tmp_path / "step-2").exists() and list(tmp_path.glob("corrupt-step-2-*"))


def test_folder_without_marker_or_torn_temp_folder_is_ignored(tmp_path: Path) -> None:
    ckpt, _, _ = make(tmp_path)
    ckpt.save(TrainState(global_step=1))
    (tmp_path / "step-5").mkdir()  # no completion marker: never a checkpoint
    (tmp_path / "step-5" / PAYLOAD).write_bytes(b"partial")
    (tmp_path / ".tmp-step-6-abcd").mkdir()
    assert LocalStorage(tmp_path).committed_steps() == [1]
    assert make(tmp_path)[0].resume().global_step == 1
    assert not (tmp_path / ".tmp-step-6-abcd").exists()  # resume cleaned the crashed save's leftovers


def test_keeps_only_the_last_k(tmp_path: Path) -> None:
    ckpt, _, _ = make(tmp_path, keep=2)
    for step in range(1, 5):
        ckpt.save(TrainState(global_step=step))
    assert LocalStorage(tmp_path).committed_steps() == [4, 3]


def test_async_save_commits_after_wait(tmp_path: Path) -> None:
    ckpt, model, _ = make(tmp_path, async_save=True)
    ckpt.save(TrainState(global_step=3))
    with torch.no_grad():  # training goes on while the writer runs; the checkpoint keeps the old values
        before = [p.clone() for p in model.parameters()]
        for p in model.parameters():
            p.add_(1.0)
    ckpt.wait()
    assert (tmp_path / "step-3" / MARKER).is_file()
    ckpt3, model3, _ = make(tmp_path)
    ckpt3.resume()
    assert all(torch.equal(a, b) for a, b in zip(before, model3.parameters(), strict=True))


def test_resaving_a_step_replaces_it(tmp_path: Path) -> None:
    ckpt, _, _ = make(tmp_path)
    ckpt.save(TrainState(global_step=2, extra={"v": 1}))
    ckpt.save(TrainState(global_step=2, extra={"v": 2}))
    assert make(tmp_path)[0].resume().extra == {"v": 2}


def test_next_epoch_prevents_repeating_a_finished_epoch() -> None:
    state = TrainState(epoch=2, step_in_epoch=10, global_step=30)
    state.next_epoch()
    assert (state.epoch, state.step_in_epoch, state.global_step) == (3, 0, 30)


def test_sampler_skip_resumes_at_the_exact_index() -> None:
    dataset = list(range(20))
    full = ResumableDistributedSampler(dataset, num_replicas=2, rank=1, shuffle=True, seed=3)
    full.set_epoch(4)
    order = list(full)
    resumed = ResumableDistributedSampler(dataset, num_replicas=2, rank=1, shuffle=True, seed=3)
    resumed.set_epoch(4)
    resumed.skip(6)
    assert len(resumed) == 4 and list(resumed) == order[6:]
    assert list(resumed) == order  # the skip applies to one iteration only


def test_streamed_digest_equals_a_fresh_one(tmp_path: Path) -> None:
    # The save hashes the payload while torch.save writes it; that is only right while torch.save appends.
    big = torch.rand(3 << 20)
    state: dict[str, object] = {f"t{i}": torch.rand(i * 1000 + 1) for i in range(50)}
    state |= {"big": big, "meta": [1, "x"]}
    storage = LocalStorage(tmp_path)
    manifest = storage.write(9, state, {})
    assert manifest.sha256 == file_sha256(tmp_path / "step-9" / PAYLOAD)
    assert manifest.size == (tmp_path / "step-9" / PAYLOAD).stat().st_size
    assert storage.verify(9) is None
    assert torch.equal(storage.read(9, "cpu", verify=True)["big"], big)


def test_purge_never_removes_the_step_just_written(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    for step in (100, 200, 1):  # an older run left higher step numbers behind
        storage.write(step, {"x": torch.zeros(1)}, {})
    assert storage.purge(2, protect=1) == [100]
    assert storage.committed_steps() == [200, 1]


def test_payload_is_durable_before_its_marker_exists_and_before_the_rename(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # A crash may leave a committed folder only if its payload reached the disk first: the payload's fsync must
    # come after torch.save's last byte, and before the marker is written and the folder renamed into place.
    events: list[tuple[str, str, int, bool]] = []
    fsync, rename = os.fsync, os.rename

    def recording_fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        marker = os.path.exists(os.path.join(os.path.dirname(path), MARKER))
        events.append(("fsync", os.path.basename(path), os.stat(path).st_size, marker))
        fsync(fd)

    def recording_rename(src: str, dst: str) -> None:
        events.append(("rename", os.path.basename(dst), 0, False))
        rename(src, dst)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "rename", recording_rename)
    manifest = LocalStorage(tmp_path).write(3, {"big": torch.rand(1 << 20)}, {})
    kinds = [(kind, name) for kind, name, _, _ in events]
    payload = kinds.index(("fsync", PAYLOAD))
    assert events[payload][2:] == (manifest.size, False)  # whole file synced, no marker yet
    assert payload < kinds.index(("fsync", MARKER)) < kinds.index(("rename", "step-3"))


def resumed_draws(tmp_path: Path, rank: int, world: int) -> tuple[float, float, float]:
    """Resume as rank ``rank`` of ``world`` (the attributes a process group would set) and draw once from each
    RNG the checkpoint restores."""
    ckpt, _, _ = make(tmp_path)
    ckpt.rank, ckpt.world_size = rank, world
    found = ckpt.load_latest_valid()
    assert found is not None
    ckpt._restore(*found)  # what resume() does once the data reached this rank
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def test_a_world_size_change_seeds_each_rank_from_the_checkpoint_deterministically(tmp_path: Path,
                                                                                   caplog: pytest.LogCaptureFixture
                                                                                   ) -> None:
    ckpt, model, opt = make(tmp_path)
    train(model, opt)
    ckpt.save(TrainState(global_step=1))  # written by one rank
    own = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    with caplog.at_level(logging.INFO, logger="ddpjob.checkpoint"):
        ranks = [resumed_draws(tmp_path, r, 3) for r in range(3)]
    assert "written by 1 ranks, now 3: rank 2's RNGs seeded with" in caplog.text
    assert len(set(ranks)) == 3, "two ranks share a stream"  # the old modulo rule gave all three the same one
    assert own not in ranks
    assert [resumed_draws(tmp_path, r, 3) for r in range(3)] == ranks  # the same checkpoint, the same streams
    assert resumed_draws(tmp_path, 0, 2) != ranks[0]  # another world size, other streams
    assert resumed_draws(tmp_path, 0, 1) == own  # unchanged world: rank 0's own state, exactly

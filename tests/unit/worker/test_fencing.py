"""The fencing rule, its on-disk records, and how the writers of several volumes combine them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ddpjob_worker import fencing
from ddpjob_worker.fencing import Fence, FenceView
from ddpjob_worker.replicas import VolumeLayout, plan_resume
from ddpjob_worker.storage import LocalStorage


@pytest.mark.parametrize(("incarnation", "step", "fences", "fenced"), [
    # nothing recorded (a volume from before fencing, or the first start): everything is valid
    (0, 10, [], None),
    # incarnation 2 resumed from step 10: incarnation 1's steps up to 10 stay valid, later ones are stale
    (1, 10, [Fence(2, 10)], None),
    (1, 5, [Fence(2, 10)], None),
    (1, 15, [Fence(2, 10)], Fence(2, 10)),
    # a record never fences its own incarnation's checkpoints, nor later ones
    (2, 15, [Fence(2, 10)], None),
    (3, 12, [Fence(2, 10)], None),
    # a later incarnation that started from scratch adopted nothing of what came before
    (1, 0, [Fence(2, None)], Fence(2, None)),
    (2, 40, [Fence(1, None), Fence(2, None)], None),
    # checkpoints without an incarnation (written before fencing) count as 0
    (0, 100, [Fence(1, 100)], None),
    (0, 120, [Fence(1, 100)], Fence(1, 100)),
    # stale once is stale for good: a later incarnation that resumed past the step does not revive it
    (1, 20, [Fence(2, 10), Fence(3, 30)], Fence(2, 10)),
    # the earliest incarnation that passed it over is the one named
    (1, 20, [Fence(3, 15), Fence(2, 10)], Fence(2, 10)),
    (1, 12, [Fence(2, 15), Fence(3, 10)], Fence(3, 10)),
])
def test_a_checkpoint_is_stale_when_a_later_incarnation_resumed_from_an_earlier_step(
        incarnation: int, step: int, fences: list[Fence], fenced: Fence | None) -> None:
    assert fencing.fenced_by(incarnation, step, fences) == fenced


@pytest.mark.parametrize("fence", [Fence(1, None), Fence(2, 0), Fence(17, 123456)])
def test_a_record_is_its_file_name(fence: Fence) -> None:
    assert fencing.parse_record_name(fencing.record_name(fence)) == fence


@pytest.mark.parametrize("name", [".tmp-1a2b", "incarnation-x-resumed-from-3.json", "notes.txt",
                                  "incarnation-2-resumed-from-3.json.bak"])
def test_other_files_in_the_fence_folder_are_not_records(name: str) -> None:
    assert fencing.parse_record_name(name) is None


def test_records_are_stored_atomically_and_idempotently(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    assert storage.fences() == []
    for fence in (Fence(2, 10), Fence(1, None), Fence(2, 10)):
        storage.add_fence(fence)
    assert storage.fences() == [Fence(1, None), Fence(2, 10)]
    assert sorted(p.name for p in (tmp_path / fencing.FENCE_DIR).iterdir()) == [
        "incarnation-1-resumed-from-none.json", "incarnation-2-resumed-from-10.json"]  # no temporary files left


def test_incarnations_only_grow_even_when_the_records_are_lost(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    storage.write(7, {"x": torch.zeros(1)}, {fencing.INCARNATION: 4})
    assert fencing.begin(storage, fencing.read_view(storage), 7) == 5
    assert storage.fences() == [Fence(5, 7)]


def test_views_merge_into_the_union_of_every_volume() -> None:
    a = FenceView(frozenset({Fence(1, None), Fence(2, 10)}), 2)
    b = FenceView(frozenset({Fence(1, None)}), 3)
    assert fencing.merge([a, None, b]) == FenceView(frozenset({Fence(1, None), Fence(2, 10)}), 3)
    assert fencing.merge([None, None]) == FenceView()


def _commit(storage: LocalStorage, step: int, incarnation: int) -> None:
    storage.write(step, {"x": torch.full((1,), float(step))}, {fencing.INCARNATION: incarnation})


def _newest_valid(storage: LocalStorage, fences: frozenset[Fence]) -> int | None:
    return next((s for s in storage.committed_steps() if fencing.stale_reason(storage, s, fences) is None), None)


def test_per_pod_volumes_share_their_records_so_a_partitioned_pods_late_save_is_stale_everywhere(
        tmp_path: Path) -> None:
    # Incarnation 1: pods a and b, each with its own volume (no claim), checkpoints 5 and 10 on both.
    a, b = LocalStorage(tmp_path / "a"), LocalStorage(tmp_path / "b")
    view = fencing.merge([fencing.read_view(a), fencing.read_view(b)])
    assert {fencing.begin(a, view, None), fencing.begin(b, view, None)} == {1}
    for volume in (a, b):
        _commit(volume, 5, 1)
        _commit(volume, 10, 1)
    # Pod b is partitioned; its replacement c (a fresh volume) and pod a form incarnation 2, resuming from 10.
    c = LocalStorage(tmp_path / "c")
    view = fencing.merge([fencing.read_view(a), fencing.read_view(c)])
    assert {fencing.begin(a, view, 10), fencing.begin(c, view, 10)} == {2}
    assert c.fences() == a.fences() == [Fence(1, None), Fence(2, 10)]  # the fresh volume carries the history
    for volume in (a, c):
        _commit(volume, 12, 2)
    # Pod b, still running, finishes its save of step 15: its own volume never saw incarnation 2's record, so the
    # check before its commit cannot stop it there.
    fencing.ensure_current(b, 1)
    _commit(b, 15, 1)
    # The partition heals and b rejoins: with the union of the records, every writer rejects b's step 15.
    view = fencing.merge([fencing.read_view(v) for v in (a, b, c)])
    newest = [_newest_valid(v, view.fences) for v in (a, b, c)]
    assert newest == [12, 10, 12]
    assert plan_resume(newest, VolumeLayout(volumes=("a", "b", "c"), pods=("a", "b", "c"))).step == 12
    assert fencing.stale_reason(b, 15, view.fences) == (
        "committed by incarnation 1 after incarnation 2 resumed from step-10")
    assert fencing.begin(b, view, 12) == 3
    assert b.fences() == [Fence(1, None), Fence(2, 10), Fence(3, 12)]

"""Volume identity, the writer of each volume, and the resume plan when ranks do not share one volume."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
from ddpjob_worker import replicas
from ddpjob_worker.replicas import ResumePlan, VolumeLayout, plan_resume
from ddpjob_worker.storage import VOLUME_ID, LocalStorage


def layout(volumes: str, pods: str | None = None) -> VolumeLayout:
    """``layout("aabb")``: ranks 0,1 on volume a and ranks 2,3 on volume b (pods default to the volumes)."""
    return VolumeLayout(volumes=tuple(volumes), pods=tuple(pods or volumes))


@pytest.mark.parametrize(("volumes", "writers"), [("aaaa", (0,)), ("aabb", (0, 2)), ("abab", (0, 1)),
                                                  ("abcd", (0, 1, 2, 3))])
def test_the_lowest_rank_of_each_volume_writes(volumes: str, writers: tuple[int, ...]) -> None:
    assert layout(volumes).writers == writers
    assert all(layout(volumes).writer(r) in writers for r in range(len(volumes)))


@pytest.mark.parametrize(("volumes", "newest", "plan"), [
    # one shared volume: rank 0 verified step 8, everyone loads it from the volume
    ("aaaa", [8, None, None, None], ResumePlan(8, 0, frozenset({0, 1, 2, 3}), 4)),
    # a pod per volume, all copies there: nothing crosses the network
    ("aabb", [8, None, 8, None], ResumePlan(8, 0, frozenset({0, 1, 2, 3}), 4)),
    # pod b was replaced (empty volume): its ranks receive step 8 from rank 0
    ("aabb", [8, None, None, None], ResumePlan(8, 0, frozenset({0, 1}), 4)),
    # pod a's newest copy was corrupt (it fell back to 6); b still holds 8, so a receives 8 from rank 2
    ("aabb", [6, None, 8, None], ResumePlan(8, 2, frozenset({2, 3}), 4)),
    # only a non-writer's entry would say 9: non-writers never speak for their volume
    ("aabb", [8, 9, 8, None], ResumePlan(8, 0, frozenset({0, 1, 2, 3}), 4)),
    ("ab", [None, None], ResumePlan(None, None, frozenset(), 2)),
])
def test_resume_plan_takes_the_newest_step_any_volume_holds(volumes: str, newest: list[int | None],
                                                           plan: ResumePlan) -> None:
    assert plan_resume(newest, layout(volumes)) == plan


def test_receivers_are_the_ranks_whose_volume_lacks_the_step() -> None:
    assert plan_resume([6, None, 8, None], layout("aabb")).receivers == {0, 1}
    assert plan_resume([None, None], layout("ab")).receivers == frozenset()


@pytest.mark.parametrize(("volumes", "pods", "level", "says"), [
    ("aaaa", "wxyz", logging.INFO, "shared by all 4 ranks"),
    ("aabb", "aabb", logging.INFO, "each of the 2 pods has its own checkpoint volume"),
    # two pods on one node share a ReadWriteOnce claim's directory, the third is elsewhere
    ("aab", "xyz", logging.WARNING, "2 different volumes for 3 pods"),
])
def test_storage_mode_is_logged(volumes: str, pods: str, level: int, says: str) -> None:
    got_level, message = layout(volumes, pods).describe()
    assert got_level == level and says in message


def test_volume_id_is_shared_by_a_directory_and_differs_between_directories(tmp_path: Path) -> None:
    first = LocalStorage(tmp_path / "a").volume_id()
    assert LocalStorage(tmp_path / "a").volume_id() == first
    assert LocalStorage(tmp_path / "b").volume_id() != first
    (tmp_path / "a" / VOLUME_ID).unlink()  # a wiped volume (a replaced pod's emptyDir) is a new volume
    assert LocalStorage(tmp_path / "a").volume_id() != first


def test_volume_id_created_concurrently_is_one_id(tmp_path: Path) -> None:
    ids: list[str] = []
    threads = [threading.Thread(target=lambda: ids.append(LocalStorage(tmp_path / "c").volume_id()))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == 8 and len(set(ids)) == 1
    assert [p.name for p in (tmp_path / "c").iterdir()] == [VOLUME_ID]  # no candidate files left behind


@pytest.mark.parametrize(("backend", "side"), [
    ("gloo", False), ("GLOO", False),
    ("nccl", True), ("cpu:gloo,cuda:nccl", True), ("mpi", True), ("ucc", True),
])
def test_object_collectives_get_a_gloo_group_unless_the_default_is_gloo(backend: str, side: bool) -> None:
    """Issue 23 #13: under NCCL they ran on the default group and so on each rank's *current* CUDA device."""
    assert replicas.needs_object_group(backend) is side

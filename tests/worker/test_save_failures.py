"""A checkpoint save that fails on a writer rank, with two gloo ranks: every rank raises the same error naming the
writer and the cause, whether the save was asynchronous or not, and the ranks stay in step afterwards."""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from ddpjob_worker import contract
from ddpjob_worker.checkpoint import CheckpointConfig, Checkpointer, CheckpointSaveFailed, TrainState
from ddpjob_worker.storage import LocalStorage, Manifest
from torch.multiprocessing.spawn import spawn

pytestmark = pytest.mark.torchrun  # starts real distributed processes (gloo), like the torchrun tests


class FullDisk(LocalStorage):
    """A volume that is full when ``fail`` says so: writing the payload fails with ENOSPC."""

    def __init__(self, root: Path, fail: Callable[[int], bool]) -> None:
        super().__init__(root)
        self.fail = fail

    def write(self, step: int, state: Mapping[str, Any], meta: Mapping[str, Any], **kwargs: Any) -> Manifest:
        if self.fail(step):
            raise OSError(28, "No space left on device")
        return super().write(step, state, meta, **kwargs)


def _outcome(call: Callable[[], None]) -> dict[str, Any] | None:
    """What ``call`` raised: message and whether this rank's own error is attached as the cause."""
    try:
        call()
    except CheckpointSaveFailed as err:
        return {"message": str(err), "cause": type(err.__cause__).__name__ if err.__cause__ else None,
                "failures": err.failures}
    return None


def _shared_volume(rank: int, root: Path) -> dict[str, Any]:
    """Both ranks on one volume: rank 0 writes, rank 1 never touches the disk; saves of even steps fail."""
    model = torch.nn.Linear(2, 2)
    ckpt = Checkpointer(CheckpointConfig(directory=str(root / "shared"), handle_sigterm=False, keep=10,
                                         async_save=True),
                        model=model, storage=FullDisk(root / "shared", fail=lambda step: step % 2 == 0))
    ckpt.resume()
    results: dict[str, Any] = {"writer": ckpt.is_writer}
    ckpt.save(TrainState(global_step=2))  # fails in the background on rank 0
    results["next_save"] = _outcome(lambda: ckpt.save(TrainState(global_step=3)))
    ckpt.save(TrainState(global_step=3))
    ckpt.save(TrainState(global_step=4))  # waits for step 3, then fails in the background
    results["wait"] = _outcome(ckpt.wait)
    results["sync"] = _outcome(lambda: ckpt.save(TrainState(global_step=6), blocking=True))
    ckpt.save(TrainState(global_step=7))
    results["staged"] = ckpt._background is not None  # only a writer keeps a host copy
    ckpt.close()
    results["steps"] = ckpt.storage.committed_steps()
    return results


def _per_pod_volumes(rank: int, root: Path) -> dict[str, Any]:
    """Each rank writes its own volume; only rank 1's is full."""
    ckpt = Checkpointer(CheckpointConfig(directory=str(root / f"pod-{rank}"), handle_sigterm=False, async_save=True),
                        model=torch.nn.Linear(2, 2), storage=FullDisk(root / f"pod-{rank}", fail=lambda _: rank == 1))
    ckpt.resume()
    ckpt.save(TrainState(global_step=1))
    return {"close": _outcome(ckpt.close)}


def _run(rank: int, root: Path) -> None:
    os.environ[contract.DDPJOB_WORKER_INDEX] = str(rank)  # one pod per rank
    dist.init_process_group("gloo", init_method=f"file://{root}/store", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))  # a rank left behind fails the test, not hangs it
    results = {"shared": _shared_volume(rank, root), "per_pod": _per_pod_volumes(rank, root)}
    (root / f"result-{rank}.json").write_text(json.dumps(results))
    # Not destroy_process_group nor a normal exit: on torch 2.6-2.10 the gloo group's teardown after these
    # collectives can hang (the GIL against gloo's thread freeing a tensor torch made inside all_gather_object).
    # The results are written; the test is about them, not about torch's teardown.
    os._exit(0)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Both scenarios, run once by two spawned ranks: what each rank saw."""
    root = tmp_path_factory.mktemp("save-failures")
    spawn(_run, args=(root,), nprocs=2, join=True)  # type: ignore[no-untyped-call]
    return [json.loads((root / f"result-{r}.json").read_text()) for r in range(2)]


@pytest.mark.timeout(240)
def test_a_writers_failed_save_raises_the_same_error_on_every_rank(results: list[dict[str, Any]]) -> None:
    writer, other = (r["shared"] for r in results)
    assert (writer["writer"], other["writer"]) == (True, False)
    for phase, step in (("next_save", 2), ("wait", 4), ("sync", 6)):
        assert writer[phase] is not None and other[phase] is not None, phase
        assert writer[phase]["message"] == other[phase]["message"], phase
        assert other[phase]["failures"] == [[0, step, "OSError: [Errno 28] No space left on device"]], phase
        assert f"step-{step} on rank 0: OSError" in other[phase]["message"]
        assert (writer[phase]["cause"], other[phase]["cause"]) == ("OSError", None), phase  # the writer keeps its own
    assert writer["steps"] == other["steps"] == [7, 3]  # after each failure the ranks went on in step
    assert (writer["staged"], other["staged"]) == (True, False)


@pytest.mark.timeout(240)
def test_with_per_pod_volumes_every_rank_learns_which_writer_failed(results: list[dict[str, Any]]) -> None:
    outcomes = [r["per_pod"]["close"] for r in results]
    assert outcomes[0] is not None and outcomes[1] is not None
    assert outcomes[0]["failures"] == outcomes[1]["failures"] == [[1, 1, "OSError: [Errno 28] No space left on device"]]
    assert (outcomes[0]["cause"], outcomes[1]["cause"]) == (None, "OSError")

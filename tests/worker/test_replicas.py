"""The checkpoint library with two gloo ranks whose checkpoint directories differ (a pod's emptyDir each): every
volume gets a full copy, a corrupt or missing newest copy is received from the peer and stored again."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from ddpjob_worker import contract
from ddpjob_worker.checkpoint import CheckpointConfig, Checkpointer, TrainState
from ddpjob_worker.storage import PAYLOAD, LocalStorage
from torch.multiprocessing.spawn import spawn

pytestmark = pytest.mark.torchrun  # starts real distributed processes (gloo), like the torchrun tests


def _checkpointer(root: Path, rank: int) -> tuple[Checkpointer, torch.nn.Linear]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 3)
    ckpt = Checkpointer(CheckpointConfig(directory=str(root / f"pod-{rank}"), handle_sigterm=False, keep=2),
                        model=model)
    return ckpt, model


def _resume(root: Path, rank: int) -> dict[str, object]:
    ckpt, model = _checkpointer(root, rank)
    state = ckpt.resume()
    return {"step": state.global_step, "weight": float(model.weight.detach().sum())}


def _phases(rank: int, root: Path) -> None:
    os.environ[contract.DDPJOB_WORKER_INDEX] = str(rank)  # one pod per rank
    dist.init_process_group("gloo", init_method=f"file://{root}/store", rank=rank, world_size=2)
    results: dict[str, object] = {}
    ckpt, model = _checkpointer(root, rank)
    results["writer"] = ckpt.is_writer
    for step in (1, 2):
        with torch.no_grad():
            model.weight.fill_(float(step))
        ckpt.save(TrainState(global_step=step))
    dist.barrier()
    if rank == 0:  # pod 0's newest copy rots: it falls back to step 1, but pod 1 still holds step 2
        payload = root / "pod-0" / "step-2" / PAYLOAD
        data = bytearray(payload.read_bytes())
        data[len(data) // 2] ^= 0x01
        payload.write_bytes(bytes(data))
    dist.barrier()
    results["corrupt"] = _resume(root, rank)
    dist.barrier()
    if rank == 1:  # pod 1 is replaced: a new, empty emptyDir
        shutil.rmtree(root / "pod-1")
    dist.barrier()
    results["replaced"] = _resume(root, rank)
    (root / f"result-{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


@pytest.mark.timeout(180)
def test_each_volume_gets_a_copy_and_a_missing_newest_copy_comes_from_the_peer(tmp_path: Path) -> None:
    spawn(_phases, args=(tmp_path,), nprocs=2, join=True)  # type: ignore[no-untyped-call]
    results = [json.loads((tmp_path / f"result-{r}.json").read_text()) for r in range(2)]
    assert [r["writer"] for r in results] == [True, True]  # different volumes: each pod's rank writes
    for r in results:
        assert r["corrupt"] == {"step": 2, "weight": 18.0}  # step 2 (weight 2.0 x 9), not the fallback step 1
        assert r["replaced"] == {"step": 2, "weight": 18.0}
    for pod in ("pod-0", "pod-1"):  # pod 0 stored the received step 2 again; the replaced pod 1 holds it too
        storage = LocalStorage(tmp_path / pod)
        assert storage.committed_steps()[0] == 2 and storage.verify(2) is None
    assert list((tmp_path / "pod-0").glob("corrupt-step-2-*"))

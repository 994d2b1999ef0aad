"""The checkpoint library's collectives under NCCL with CUDA state: a save (sync, then asynchronous through pinned
staging buffers), a resume that puts every tensor back on the rank's own GPU with the optimizer, GradScaler and
CUDA RNG state bit for bit, the preemption vote, and a failed save raised on every rank.

Needs a GPU (skipped without one: CI has none); the device machine runs it (hack/gpu-check.sh). One rank per GPU,
as NCCL requires: world size 2 where two GPUs are visible, else 1 (NCCL refuses two ranks on one GPU).
"""

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
from ddpjob_worker.checkpoint import CheckpointConfig, Checkpointer, TrainState
from ddpjob_worker.staging import CheckpointSaveFailed
from ddpjob_worker.storage import LocalStorage, Manifest
from torch.multiprocessing.spawn import spawn

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)"),
]


class FullDisk(LocalStorage):
    """A volume that refuses step 9 with ENOSPC."""

    def write(self, step: int, state: Mapping[str, Any], meta: Mapping[str, Any], **kwargs: Any) -> Manifest:
        if step == 9:
            raise OSError(28, "No space left on device")
        return super().write(step, state, meta, **kwargs)


def _trainer(rank: int, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.amp.GradScaler]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)).cuda(rank)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2), torch.amp.GradScaler("cuda")


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler, steps: int) -> None:
    for _ in range(steps):
        x = torch.randn(32, 64, device="cuda")  # draws from the CUDA RNG, which the checkpoint must restore
        with torch.autocast("cuda"):
            loss = model(x).square().mean()
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()


def _fingerprint(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[float]:
    tensors = [*model.state_dict().values()]
    tensors += [v for s in opt.state_dict()["state"].values() for v in s.values() if isinstance(v, torch.Tensor)]
    return [float(t.double().sum()) for t in tensors]


def _rank(rank: int, world: int, root: Path) -> None:
    os.environ[contract.DDPJOB_WORKER_INDEX] = "0"  # one shared volume: rank 0 writes
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{root}/store", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60), device_id=torch.device("cuda", rank))
    out: dict[str, Any] = {"backend": dist.get_backend()}
    model, opt, scaler = _trainer(rank, seed=1)
    ckpt = Checkpointer(CheckpointConfig(directory=str(root / "ckpt"), handle_sigterm=False, keep=3,
                                         async_save=True),
                        model=model, optimizer=opt, grad_scaler=scaler)
    out["fresh_step"] = ckpt.resume().global_step
    _train(model, opt, scaler, 3)
    ckpt.save(TrainState(global_step=3), blocking=True)
    _train(model, opt, scaler, 2)
    ckpt.save(TrainState(global_step=5))  # asynchronous: pinned staging buffers, written by a thread
    out["saved"] = _fingerprint(model, opt)
    out["scale_saved"] = scaler.get_scale()
    out["cuda_rng_saved"] = torch.cuda.get_rng_state().tolist()
    ckpt.wait()
    # What the library keeps (not an API): a host buffer per tensor; those of CUDA tensors (the model's and the
    # optimizer's moments) must be pinned, CPU ones (RNG states, AdamW's step counts) need not be.
    buffers = ckpt._background.staging._buffers if ckpt._background is not None else {}
    out["staged_model"] = sorted(str(k) for k in buffers if k[0] == "model")
    out["staging_pinned"] = all(b.is_pinned() for k, b in buffers.items() if k[0] == "model" or "exp_avg" in k)
    out["preempted"] = ckpt.preempted()  # the vote: an all_reduce of a tensor on this rank's GPU
    ckpt.close()
    _train(model, opt, scaler, 1)  # moves the CUDA RNG on, so a resume that skips it is caught
    model2, opt2, scaler2 = _trainer(rank, seed=2)
    ckpt2 = Checkpointer(CheckpointConfig(directory=str(root / "ckpt"), handle_sigterm=False, keep=3),
                         model=model2, optimizer=opt2, grad_scaler=scaler2)
    out["resumed_step"] = ckpt2.resume().global_step
    out["resumed"] = _fingerprint(model2, opt2)
    out["cuda_rng_resumed"] = torch.cuda.get_rng_state().tolist()
    out["devices"] = sorted({str(t.device) for t in [*model2.state_dict().values(), *[
        v for s in opt2.state_dict()["state"].values() for v in s.values() if isinstance(v, torch.Tensor)
        and v.dim() > 0]]})
    out["scale"] = [out["scale_saved"], scaler2.get_scale()]
    ckpt2.close()
    failing = Checkpointer(CheckpointConfig(directory=str(root / "full"), handle_sigterm=False),
                           model=model2, storage=FullDisk(root / "full"))
    try:
        failing.save(TrainState(global_step=9), blocking=True)
        out["failed_save"] = None
    except CheckpointSaveFailed as err:
        out["failed_save"] = str(err)
    (root / f"result-{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


def _ranks(target: Callable[[int, int, Path], None], root: Path) -> list[dict[str, Any]]:
    """``target`` on one rank per GPU (two at most): what each rank wrote to result-<rank>.json."""
    world = min(2, torch.cuda.device_count())
    spawn(target, args=(world, root), nprocs=world, join=True)  # type: ignore[no-untyped-call]
    return [json.loads((root / f"result-{rank}.json").read_text()) for rank in range(world)]


@pytest.mark.timeout(300)
def test_checkpoint_collectives_under_nccl(tmp_path: Path) -> None:
    results = _ranks(_rank, tmp_path)
    world = len(results)
    for rank, out in enumerate(results):
        print(f"rank {rank} of {world}: backend {out['backend']}, devices {out['devices']}, scale {out['scale']}")
        assert out["backend"] == "nccl"
        assert out["fresh_step"] == 0 and out["resumed_step"] == 5
        assert out["resumed"] == out["saved"], "parameters or optimizer state differ after resume"
        assert out["cuda_rng_resumed"] == out["cuda_rng_saved"], "the CUDA RNG state was not restored"
        assert out["devices"] == [f"cuda:{rank}"], out["devices"]
        assert out["scale"][0] == out["scale"][1], "the GradScaler's scale was not restored"
        assert out["staged_model"] and out["staging_pinned"], "an asynchronous save did not stage into pinned memory"
        assert out["preempted"] is False
        assert out["failed_save"] is not None and "No space left on device" in out["failed_save"], out["failed_save"]


def _rank_without_set_device(rank: int, world: int, root: Path) -> None:
    """The PyTorch DDP tutorial's way: the model on cuda:RANK, torch.cuda.set_device never called, so the current
    device is cuda:0 on every rank (issue 23 #13)."""
    os.environ[contract.DDPJOB_WORKER_INDEX] = str(rank)  # one volume per rank: every rank writes
    dist.init_process_group("nccl", init_method=f"file://{root}/store", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))  # a hang fails the test instead
    model, opt, scaler = _trainer(rank, seed=1)
    ckpt = Checkpointer(CheckpointConfig(directory=str(root / f"ckpt-{rank}"), handle_sigterm=False),
                        model=model, optimizer=opt, grad_scaler=scaler)
    out: dict[str, Any] = {"objects": dist.get_backend(ckpt._objects) if ckpt._objects is not None else None}
    ckpt.resume()
    _train(model, opt, scaler, 2)
    ckpt.save(TrainState(global_step=2), blocking=True)
    out["saved"] = _fingerprint(model, opt)
    out["rng_saved"] = torch.cuda.get_rng_state(rank).tolist()
    ckpt.close()
    _train(model, opt, scaler, 1)
    model2, opt2, scaler2 = _trainer(rank, seed=2)
    ckpt2 = Checkpointer(CheckpointConfig(directory=str(root / f"ckpt-{rank}"), handle_sigterm=False),
                         model=model2, optimizer=opt2, grad_scaler=scaler2)
    out["resumed_step"] = ckpt2.resume().global_step
    out["resumed"] = _fingerprint(model2, opt2)
    out["rng_resumed"] = torch.cuda.get_rng_state(rank).tolist()
    ckpt2.close()
    (root / f"result-{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


@pytest.mark.timeout(300)
def test_a_script_that_never_sets_its_cuda_device(tmp_path: Path) -> None:
    for rank, out in enumerate(_ranks(_rank_without_set_device, tmp_path)):
        assert out["objects"] == "gloo", "the object collectives must not run on NCCL"
        assert out["resumed_step"] == 2 and out["resumed"] == out["saved"]
        assert out["rng_resumed"] == out["rng_saved"], f"cuda:{rank}'s RNG state was not restored"

"""Test script: checkpoints the way the Hugging Face Trainer does, with nothing of ddpjob in it. Rank 0 writes
``<out>/checkpoint-N/`` (model and optimizer), every rank then writes its ``rng_state_<rank>.pth`` into it with no
barrier, and rank 0 writes ``trainer_state.json`` last. At start every rank loads the newest ``checkpoint-N`` it
finds in its own folder (HF's get_last_checkpoint) and fails, as HF does, when a file of it is missing. A kill
and a lost pod must resume it bitwise: ends with ``FINAL <sha256 of the parameters>`` on rank 0.

Arguments: out_dir total_steps every sleep_seconds (OUT_DIR in the environment overrides out_dir: several agents
on one machine stand for pods, each with its own folder)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time

import torch
import torch.distributed as dist

out, total, every, pause = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
out = os.environ.get("OUT_DIR") or out
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)


def last_checkpoint() -> str | None:
    if not os.path.isdir(out):
        return None
    found = [d for d in os.listdir(out) if re.fullmatch(r"checkpoint-\d+", d) and os.path.isdir(f"{out}/{d}")]
    return f"{out}/{max(found, key=lambda d: int(d.split('-')[1]))}" if found else None


start = 0
resume = last_checkpoint()
if resume is not None:
    for name in ("model.pt", "optimizer.pt", "trainer_state.json", f"rng_state_{rank}.pth"):
        if not os.path.exists(f"{resume}/{name}"):
            raise ValueError(f"Can't find a valid checkpoint at {resume} (no {name})")
    model.load_state_dict(torch.load(f"{resume}/model.pt"))
    opt.load_state_dict(torch.load(f"{resume}/optimizer.pt"))
    torch.set_rng_state(torch.load(f"{resume}/rng_state_{rank}.pth"))
    with open(f"{resume}/trainer_state.json") as f:
        start = json.load(f)["global_step"]
print(f"RESUMED_FROM={resume or 'none'} rank {rank}", flush=True)

for step in range(start + 1, total + 1):
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(8, 16, generator=g)
    y = x.sum(dim=1, keepdim=True).sin()
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(ddp(x + 0.01 * torch.randn(8, 16)), y)
    loss.backward()  # type: ignore[no-untyped-call]
    opt.step()
    print(f"STEP {step} rank {rank}", flush=True)
    if step % every == 0:
        d = f"{out}/checkpoint-{step}"
        if rank == 0:
            os.makedirs(d, exist_ok=True)
            torch.save(model.state_dict(), f"{d}/model.pt")
            torch.save(opt.state_dict(), f"{d}/optimizer.pt")
        dist.barrier()  # HF's save_model syncs before the per-rank RNG files
        os.makedirs(d, exist_ok=True)
        torch.save(torch.get_rng_state(), f"{d}/rng_state_{rank}.pth")
        if rank == 0:
            with open(f"{d}/trainer_state.json", "w") as f:
                json.dump({"global_step": step}, f)
    time.sleep(pause)

if rank == 0:
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    print(f"FINAL {digest}", flush=True)
dist.destroy_process_group()

"""bench/replication_bench.py's trainer: a DDP step of steady compute, and every N steps rank 0 writes a checkpoint
of SIZE MB the way the Hugging Face Trainer does (``checkpoint-N/model.pt`` then ``trainer_state.json``), nothing of
ddpjob in it. Rank 0 ends by writing, to TIMES (a JSON file), each step's end time and each checkpoint's end time.

Arguments: out_dir steps every size_mb times_file (OUT_DIR in the environment overrides out_dir)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

import torch
import torch.distributed as dist

out, steps, every, size_mb, times = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
out = os.environ.get("OUT_DIR") or out
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(512, 512))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
payload = {"weights": torch.zeros(size_mb * (1 << 20) // 4)}  # the checkpoint's bulk (a 1 GB model's state)
x = torch.randn(256, 512)
step_ends, saves = [], []
for step in range(1, steps + 1):
    for _ in range(8):  # ~tens of ms of compute per step on one core
        opt.zero_grad()
        model(x).square().mean().backward()  # type: ignore[no-untyped-call]
        opt.step()
    step_ends.append(time.time())
    if step % every == 0 and rank == 0:
        d = f"{out}/checkpoint-{step}"
        os.makedirs(d, exist_ok=True)
        payload["weights"][0] = step
        torch.save(payload, f"{d}/model.pt")
        with open(f"{d}/trainer_state.json", "w") as f:
            json.dump({"global_step": step}, f)
        saves.append((step, time.time()))
        old = f"{out}/checkpoint-{step - 2 * every}"  # save_total_limit=2, as HF rotates
        if os.path.isdir(old):
            shutil.rmtree(old)
    dist.barrier()
if rank == 0:
    with open(times, "w") as f:
        json.dump({"step_ends": step_ends, "saves": saves}, f)
dist.destroy_process_group()

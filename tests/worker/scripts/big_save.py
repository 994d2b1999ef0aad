"""Test script: the first attempt saves step 1, then starts saving a big step 2 (the test SIGKILLs it
mid-write); the restarted attempt must resume from step 1 and say so."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from ddpjob_worker.checkpoint import CheckpointConfig, Checkpointer, TrainState

dist.init_process_group("gloo")
model = torch.nn.Linear(1, 1)
big = torch.zeros(int(os.environ.get("BIG_FLOATS", str(64 << 20))))
model.register_buffer("big", big)  # 256 MB: the save takes long enough to be killed inside it
ckpt = Checkpointer(CheckpointConfig.from_env(), model=model)
state = ckpt.resume()
if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
    big.fill_(1.0)
    ckpt.save(TrainState(global_step=1))
    print("SAVED step 1", flush=True)
    big.fill_(2.0)
    ckpt.save(TrainState(global_step=2))
    print("SAVED step 2 (the test should have killed us)", flush=True)
    time.sleep(600)
else:
    print(f"RESUMED global_step={state.global_step} big={float(big[0])}", flush=True)
    assert state.global_step == 1 and float(big[-1]) == 1.0
ckpt.close()
dist.destroy_process_group()

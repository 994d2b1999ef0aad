"""Test script: trains a one-weight model forever, a step every 0.1 s; every checkpoint write takes SAVE_SECONDS
(a slow volume), so the final save after SIGTERM needs that long."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from ddpjob_worker.checkpoint import CheckpointConfig, Checkpointer
from ddpjob_worker.storage import LocalStorage


class SlowStorage:
    """LocalStorage whose writes take SAVE_SECONDS longer."""

    def __init__(self, root: Path, seconds: float) -> None:
        self._inner = LocalStorage(root)
        self._seconds = seconds

    def write(self, *args: Any, **kwargs: Any) -> Any:
        print(f"SAVE started, taking {self._seconds:.0f}s", flush=True)
        time.sleep(self._seconds)
        return self._inner.write(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


dist.init_process_group("gloo")
config = CheckpointConfig.from_env()
model = torch.nn.Linear(1, 1)
ckpt = Checkpointer(config, model=model,
                    storage=SlowStorage(Path(config.directory), float(os.environ["SAVE_SECONDS"])))
state = ckpt.resume()
print("TRAINING", flush=True)
while True:
    with torch.no_grad():
        model.weight.add_(1.0)
    state.global_step += 1
    ckpt.after_step(state)  # on SIGTERM: saves (slowly) and exits 143
    time.sleep(0.1)

"""Test script: joins the process group, then ends as OUTCOME says: ``ok`` (exit 0), ``raise`` (a ValueError),
``sigkill`` (kills itself with SIGKILL)."""

from __future__ import annotations

import os
import signal

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
outcome = os.environ.get("OUTCOME", "ok")
print(f"OUTCOME {outcome} rank {dist.get_rank()}", flush=True)
if outcome == "raise":
    raise ValueError("learning rate must be positive, got -0.1")
if outcome == "sigkill":
    os.kill(os.getpid(), signal.SIGKILL)
dist.destroy_process_group()

# mypy: ignore-errors
"""A user's plain-DDP script with torch.distributed.checkpoint (DCP), in the style of PyTorch's "Getting Started
with Distributed Checkpoint" recipe: nothing of ddpjob, nothing but torch.

An MLP in DistributedDataParallel with Adam; the batch of each step comes from a generator seeded with (seed, step,
rank), so a run resumed at any step sees the same data as an uninterrupted one. Every --save-every steps all ranks
call `dcp.save(state, checkpoint_id=f"{out}/step-{n}")` (each rank writes its own __<rank>_0.distcp, the
coordinator the .metadata last); the state is an AppState (Stateful) built with get_state_dict/set_state_dict. At
start every rank resumes with dcp.load from the newest step-N that has its .metadata (a save killed midway has none).

Each process prints RESUMED_FROM=<step-N dir or none> and each step `step N/M`; rank 0 ends with
FINAL_PARAMS_SHA256=<sha256 of the parameters, in named_parameters order, as float32 bytes>.

usage: torchrun ... dcp_train.py [--out DIR] [--steps N] [--save-every N] [--step-sleep S] [--seed N]
"""

import argparse
import hashlib
import os
import re
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.nn.parallel import DistributedDataParallel as DDP

BATCH = 8


def say(line):
    """One line in one write: the ranks share stdout, and under PYTHONUNBUFFERED print() writes the text and its
    newline separately, so lines of two ranks could interleave."""
    print(line + "\n", end="", flush=True)


class AppState(Stateful):
    """What a checkpoint holds: the model, the optimizer and the number of steps done (a tensor, loaded in place)."""

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer
        self.step = torch.zeros((), dtype=torch.int64)

    def state_dict(self):
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optim": optimizer_state, "step": self.step}

    def load_state_dict(self, state_dict):
        set_state_dict(self.model, self.optimizer, model_state_dict=state_dict["model"],
                       optim_state_dict=state_dict["optim"])
        self.step = state_dict["step"]


def latest_checkpoint(out):
    """The newest step-N directory whose .metadata exists (DCP writes it last, once every rank's data is in)."""
    if not os.path.isdir(out):
        return None
    done = [(int(m.group(1)), name) for name in os.listdir(out)
            if (m := re.fullmatch(r"step-(\d+)", name)) and os.path.isfile(os.path.join(out, name, ".metadata"))]
    return os.path.join(out, max(done)[1]) if done else None


def batch(seed, step, rank):
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + rank)
    x = torch.randn(BATCH, 16, generator=generator)
    return x, torch.sin(x.sum(dim=1, keepdim=True))


def params_sha256(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        # The exact bytes, without numpy (not needed by torch, so maybe not in the image).
        h.update(bytes(p.detach().to("cpu", torch.float32).contiguous().view(torch.uint8).flatten().tolist()))
    return h.hexdigest()


def main():
    parser = argparse.ArgumentParser(description="DDP with torch.distributed.checkpoint")
    parser.add_argument("--out", default="/checkpoints/dcp", help="directory of the step-N checkpoints")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--save-every", type=int, default=20)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds of sleep after each step")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 1))
    ddp = DDP(model)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    app = AppState(ddp, optimizer)

    last = latest_checkpoint(args.out)
    if last is not None:
        state = {"app": app}
        dcp.load(state, checkpoint_id=last)
    say(f"RESUMED_FROM={last or 'none'}")

    for step in range(int(app.step) + 1, args.steps + 1):
        x, y = batch(args.seed, step, rank)
        optimizer.zero_grad()
        loss = F.mse_loss(ddp(x), y)
        loss.backward()
        optimizer.step()
        say(f"[rank{rank}] step {step}/{args.steps} loss {loss.item():.6f}")
        if step % args.save_every == 0:
            app.step = torch.tensor(step)
            path = os.path.join(args.out, f"step-{step}")
            dcp.save({"app": app}, checkpoint_id=path)
            say(f"[rank{rank}] saved {path}")
        if args.step_sleep:
            time.sleep(args.step_sleep)

    if rank == 0:
        say(f"FINAL_PARAMS_SHA256={params_sha256(model)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

# mypy: ignore-errors
"""A plain DDP training script, the way users write them: no ddpjob import, no progress reporting of its own. For
the stall tests (tests/e2e/test_progress.py) it can take its time before the first step (a slow start-up: a
download, a tokenizer, a big model) and hang after a given step, for ever or once (a marker file next to the
checkpoint says it did). It keeps its own checkpoint the common way: torch.save of the model, the optimizer and the
step on every node (each pod has its own disk), and torch.load at start when the file is there. Its exit can be
slow the way real ones are: an atexit handler that takes its time after the script returned (an experiment
tracker's final upload: wandb's finish runs at exit).

usage: python plain_steps.py [--steps N] [--sleep-before S] [--hang-after N [--hang-once]] [--step-seconds S]
                             [--checkpoint PATH --save-every N] [--exit-seconds S]
"""

import argparse
import atexit
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def slow_exit(seconds):
    print(f"at exit: uploading for {seconds}s", flush=True)
    time.sleep(seconds)


def main():
    parser = argparse.ArgumentParser(description="a plain DDP loop")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--sleep-before", type=float, default=0.0, help="seconds of start-up before the first step")
    parser.add_argument("--hang-after", type=int, default=0, help="hang for ever after this step (0: never)")
    parser.add_argument("--hang-once", action="store_true", help="hang only if the checkpoint's marker is absent")
    parser.add_argument("--step-seconds", type=float, default=0.1)
    parser.add_argument("--checkpoint", default="", help="file of this node's checkpoint ('': none)")
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--exit-seconds", type=float, default=0.0, help="seconds an atexit handler takes")
    args = parser.parse_args()
    if args.exit_seconds:
        atexit.register(slow_exit, args.exit_seconds)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"rank {rank}: start-up for {args.sleep_before}s", flush=True)
    time.sleep(args.sleep_before)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    done = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        done = state["step"]
        print(f"rank {rank}: resumed from step {done}", flush=True)
    marker = args.checkpoint + ".hung" if args.checkpoint else ""
    for step in range(done + 1, args.steps + 1):
        optimizer.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()
        optimizer.step()
        print(f"rank {rank}: step {step}", flush=True)
        if args.checkpoint and step % args.save_every == 0:
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            torch.save(state, args.checkpoint + ".tmp")
            os.replace(args.checkpoint + ".tmp", args.checkpoint)
        if step == args.hang_after and not (args.hang_once and marker and os.path.exists(marker)):
            if marker:
                open(marker, "w").close()
            print(f"rank {rank}: hanging after step {step}", flush=True)
            while True:
                time.sleep(3600)
        time.sleep(args.step_seconds)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

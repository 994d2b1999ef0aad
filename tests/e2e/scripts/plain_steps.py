# mypy: ignore-errors
"""A plain DDP training script, the way users write them: no ddpjob import, no progress reporting of its own. For
the stall tests (tests/e2e/test_progress.py) it can take its time before the first step (a slow start-up: a
download, a tokenizer, a big model) and hang after a given step.

usage: python plain_steps.py [--steps N] [--sleep-before S] [--hang-after N] [--step-seconds S]
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    parser = argparse.ArgumentParser(description="a plain DDP loop")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--sleep-before", type=float, default=0.0, help="seconds of start-up before the first step")
    parser.add_argument("--hang-after", type=int, default=0, help="hang for ever after this step (0: never)")
    parser.add_argument("--step-seconds", type=float, default=0.1)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"rank {rank}: start-up for {args.sleep_before}s", flush=True)
    time.sleep(args.sleep_before)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, args.steps + 1):
        optimizer.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()
        optimizer.step()
        print(f"rank {rank}: step {step}", flush=True)
        if step == args.hang_after:
            print(f"rank {rank}: hanging after step {step}", flush=True)
            while True:
                time.sleep(3600)
        time.sleep(args.step_seconds)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

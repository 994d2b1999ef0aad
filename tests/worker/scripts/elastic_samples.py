"""Test script for issue 27: one epoch of a small dataset under ElasticDistributedSampler while the test changes
the world size. Every rank appends each step's sample indices to its own JSON-lines file (with the global step,
the world size and when its group formed), then the checkpoint of that step is taken (every step): the test keeps,
for each step, the record of the last group that did it (an earlier group's record of a step it did not checkpoint
was replayed), and checks that the epoch saw every index once.

env: SAMPLES_LOG (directory of the records), SAMPLES_N (dataset size), SAMPLES_STEP_SECONDS, SAMPLES_OLD=1 (the
per-rank ResumableDistributedSampler.skip, to see it fail).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from ddpjob_worker.checkpoint import CheckpointConfig, Checkpointer
from ddpjob_worker.sampler import ElasticDistributedSampler
from torch.utils.data import DataLoader

BATCH = 2
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
n = int(os.environ.get("SAMPLES_N", "400"))
delay = float(os.environ.get("SAMPLES_STEP_SECONDS", "0.1"))
# The group's identity: rank 0's time of its rendezvous (each agent stamps its own, a few ms apart).
shared = [os.environ.get("DDPJOB_RENDEZVOUS_TIME", "0")]
dist.broadcast_object_list(shared, src=0)
group = shared[0]
log = Path(os.environ["SAMPLES_LOG"]) / f"rank-{rank}-{os.getpid()}.jsonl"
dataset = list(range(n))
sampler = ElasticDistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=1, drop_last=True)
loader: DataLoader[int] = DataLoader(dataset, batch_size=BATCH, sampler=sampler, drop_last=True)  # type: ignore[arg-type]
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
ckpt = Checkpointer(CheckpointConfig.from_env(every_steps=1), model=model, optimizer=optimizer)
state = ckpt.resume()
print(f"rank {rank}/{world}: epoch {state.epoch} from sample {state.samples_in_epoch}, step {state.global_step}",
      flush=True)
old = os.environ.get("SAMPLES_OLD") == "1"
while state.epoch < 1:
    sampler.set_epoch(state.epoch, consumed=state.samples_in_epoch)
    if old:  # what the example trainer did before: this rank's steps, whatever the world size then
        sampler.set_epoch(state.epoch, consumed=state.step_in_epoch * BATCH * world)
    with log.open("a") as out:
        for i, batch in enumerate(loader, start=1):
            optimizer.zero_grad()
            model(batch.float().unsqueeze(1)).pow(2).mean().backward()
            optimizer.step()
            state.global_step += 1
            state.step_in_epoch += 1
            state.samples_in_epoch = sampler.position(i * BATCH)
            out.write(json.dumps({"step": state.global_step, "epoch": state.epoch, "world": world, "group": group,
                                  "indices": batch.tolist()}) + "\n")
            out.flush()
            ckpt.after_step(state)
            time.sleep(delay)
    state.next_epoch()
    ckpt.save(state)
ckpt.close()
dist.destroy_process_group()

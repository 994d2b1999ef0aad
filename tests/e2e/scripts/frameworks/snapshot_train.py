# mypy: ignore-errors
"""A user's script in the form of the PyTorch DDP tutorial's multinode.py (pytorch/examples,
distributed/ddp-tutorial-series): a Trainer whose global rank 0 writes `torch.save({"MODEL_STATE", "EPOCHS_RUN"},
snapshot_path)` in place every save_every epochs, and whose every rank loads that snapshot at start when it exists.
Nothing of ddpjob, nothing but torch; gloo on CPU.

Differences from the tutorial, each needed for a bitwise-exact resume or for the tests, and nothing else:
- EPOCHS_RUN is the number of epochs *completed* (the tutorial stores the epoch just trained and trains it again
  after a resume), so a snapshot is saved when (epoch + 1) % save_every == 0;
- an MLP and mse_loss (the tutorial's Linear(20, 1) with cross_entropy over one class has a zero gradient);
- a fixed-seed dataset and model, each step printed, --step-sleep after each step, RESUMED_FROM and
  FINAL_PARAMS_SHA256 lines.
The optimizer is the tutorial's SGD without momentum: it has no state, so the snapshot needs none.

Each process prints RESUMED_FROM=<snapshot path or none> (and EPOCHS_RUN=<n>), each step `epoch E step S/N`;
rank 0 ends with FINAL_PARAMS_SHA256=<sha256 of the parameters, in named_parameters order, as float32 bytes>.

usage: torchrun ... snapshot_train.py TOTAL_EPOCHS SAVE_EVERY [--batch_size N] [--snapshot_path PATH]
                                      [--step-sleep S]
"""

import argparse
import hashlib
import os
import time

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


def say(line):
    """One line in one write: the ranks share stdout, and under PYTHONUNBUFFERED print() writes the text and its
    newline separately, so lines of two ranks could interleave."""
    print(line + "\n", end="", flush=True)


class MyTrainDataset(Dataset):
    def __init__(self, size):
        generator = torch.Generator().manual_seed(0)
        self.data = [(torch.rand(20, generator=generator), torch.rand(1, generator=generator)) for _ in range(size)]

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        return self.data[index]


def params_sha256(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        # The exact bytes, without numpy (torch does not need it, so an image may not have it).
        h.update(bytes(p.detach().to("cpu", torch.float32).contiguous().view(torch.uint8).flatten().tolist()))
    return h.hexdigest()


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path, step_sleep):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        self.step_sleep = step_sleep
        if os.path.exists(snapshot_path):
            say("Loading snapshot")
            self._load_snapshot(snapshot_path)
            say(f"RESUMED_FROM={snapshot_path} EPOCHS_RUN={self.epochs_run}")
        else:
            say("RESUMED_FROM=none")
        self.model = DDP(self.model)

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path, map_location="cpu")
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        say(f"Resuming training from snapshot at Epoch {self.epochs_run}")

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        loss.backward()
        self.optimizer.step()
        return loss

    def _run_epoch(self, epoch):
        steps = len(self.train_data)
        self.train_data.sampler.set_epoch(epoch)
        for step, (source, targets) in enumerate(self.train_data, start=1):
            loss = self._run_batch(source, targets)
            say(f"[RANK{self.global_rank}] epoch {epoch} step {step}/{steps} loss {loss.item():.6f}")
            if self.step_sleep:
                time.sleep(self.step_sleep)

    def _save_snapshot(self, epochs_run):
        snapshot = {
            "MODEL_STATE": self.model.module.state_dict(),
            "EPOCHS_RUN": epochs_run,
        }
        torch.save(snapshot, self.snapshot_path)
        say(f"Epoch {epochs_run - 1} | Training snapshot saved at {self.snapshot_path}")

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.global_rank == 0 and (epoch + 1) % self.save_every == 0:
                self._save_snapshot(epoch + 1)
        if self.global_rank == 0:
            say(f"FINAL_PARAMS_SHA256={params_sha256(self.model.module)}")


def main():
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, help="How often to save a snapshot")
    parser.add_argument("--batch_size", default=32, type=int, help="Input batch size on each process")
    parser.add_argument("--snapshot_path", default="/checkpoints/snapshot/snapshot.pt")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds of sleep after each step")
    args = parser.parse_args()
    init_process_group(backend="gloo")
    torch.manual_seed(0)
    dataset = MyTrainDataset(512)  # 8 steps per epoch with 2 processes of batch 32
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    train_data = DataLoader(dataset, batch_size=args.batch_size, shuffle=False, sampler=DistributedSampler(dataset))
    os.makedirs(os.path.dirname(os.path.abspath(args.snapshot_path)), exist_ok=True)
    trainer = Trainer(model, train_data, optimizer, args.save_every, args.snapshot_path, args.step_sleep)
    trainer.train(args.total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    main()

# mypy: ignore-errors
"""A user's training script for the e2e tier's plain image, in the style of the PyTorch DDP tutorial
("ddp-tutorial-series/multinode.py"): LOCAL_RANK/RANK from torchrun, a DistributedSampler, a snapshot that rank 0
saves every SAVE_EVERY epochs and that every rank resumes from. It imports nothing but torch.

What a careful user adds to the tutorial, and nothing more: the snapshot records the epochs *completed* (the
tutorial's resumes repeat the saved epoch), it is written to a temporary file and renamed (a kill during the save
leaves the previous one), each step prints its loss, a --step-delay stretches the run for fault injection, and
rank 0 prints a digest of its final parameters so that runs can be compared bitwise.

usage: python train.py TOTAL_EPOCHS SAVE_EVERY [--batch_size N] [--snapshot_path PATH] [--step-delay S]
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


class MyTrainDataset(Dataset):
    def __init__(self, size):
        generator = torch.Generator().manual_seed(0)
        self.data = [(torch.rand(20, generator=generator), torch.rand(1, generator=generator)) for _ in range(size)]

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        return self.data[index]


def digest(model):
    h = hashlib.sha256()
    state = model.state_dict()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(bytes(t.flatten().view(torch.uint8).tolist()))  # the exact bytes, without numpy (not in the image)
    return h.hexdigest()


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path, step_delay):
        self.rank = int(os.environ["RANK"])
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.snapshot_path = snapshot_path
        self.step_delay = step_delay
        self.epochs_run = 0
        if os.path.exists(snapshot_path):
            snapshot = torch.load(snapshot_path, map_location="cpu", weights_only=True)
            self.model.load_state_dict(snapshot["MODEL_STATE"])
            self.epochs_run = snapshot["EPOCHS_RUN"]
            print(f"[RANK{self.rank}] resuming from snapshot after epoch {self.epochs_run}", flush=True)
        self.ddp = DDP(self.model)

    def _run_epoch(self, epoch):
        self.train_data.sampler.set_epoch(epoch)
        for step, (source, targets) in enumerate(self.train_data, start=1):
            self.optimizer.zero_grad()
            loss = F.mse_loss(self.ddp(source), targets)
            loss.backward()
            self.optimizer.step()
            print(f"[RANK{self.rank}] epoch {epoch} step {step}/{len(self.train_data)} loss {loss.item():.6f}",
                  flush=True)
            time.sleep(self.step_delay)

    def _save_snapshot(self, epochs_done):
        tmp = self.snapshot_path + ".tmp"
        torch.save({"MODEL_STATE": self.model.state_dict(), "EPOCHS_RUN": epochs_done}, tmp)
        os.replace(tmp, self.snapshot_path)
        print(f"[RANK{self.rank}] snapshot saved after epoch {epochs_done} at {self.snapshot_path}", flush=True)

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.rank == 0 and (epoch + 1) % self.save_every == 0:
                self._save_snapshot(epoch + 1)
        if self.rank == 0:
            print(f"final parameters sha256 {digest(self.model)}", flush=True)


def main():
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int)
    parser.add_argument("save_every", type=int)
    parser.add_argument("--batch_size", default=64, type=int)
    parser.add_argument("--snapshot_path", default="snapshot.pt")
    parser.add_argument("--step-delay", default=0.0, type=float, help="seconds of sleep after each step")
    args = parser.parse_args()
    init_process_group(backend="gloo")
    torch.manual_seed(0)
    dataset = MyTrainDataset(2048)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=False, sampler=DistributedSampler(dataset))
    Trainer(model, loader, optimizer, args.save_every, args.snapshot_path, args.step_delay).train(args.total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    main()

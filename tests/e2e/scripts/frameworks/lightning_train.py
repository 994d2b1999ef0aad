# mypy: ignore-errors
"""A user's PyTorch Lightning script, resumed the way Lightning documents it: nothing of ddpjob.

A small LightningModule (an MLP regressor, Adam), Trainer(accelerator="cpu", strategy=DDP over gloo) with a
ModelCheckpoint every --save-every steps (save_last=True, every checkpoint kept), and
`trainer.fit(model, ckpt_path="last")` when the directory holds a last.ckpt (None before the first save). Run by
torchrun (gloo, CPU): one or more processes per node, any number of nodes (devices and num_nodes follow torchrun's
LOCAL_WORLD_SIZE and WORLD_SIZE, as Lightning requires under torchelastic).

Lightning resumes a plain (not stateful) DataLoader exactly only at an epoch boundary: from a mid-epoch checkpoint
it starts the interrupted epoch's data over while counting steps on, and warns that the loader is not resumable
(lightning/pytorch/loops/training_epoch_loop.py). So an epoch here is --epoch-steps steps (the dataset has
epoch_steps * batch * world_size samples), by default one checkpoint interval: every checkpoint falls on an epoch
end and a resumed run ends bitwise equal to an uninterrupted one. The model has no dropout: Lightning's checkpoint
holds no RNG state, so a resumed run starts from seed_everything's state, not the interrupted run's.

Each process prints RESUMED_FROM=<the checkpoint fit loaded, or none> when training starts, and each step
`step N/M`; rank 0 ends with FINAL_PARAMS_SHA256=<sha256 of the parameters, in named_parameters order, as float32
bytes>.

usage: torchrun ... lightning_train.py [--out DIR] [--steps N] [--save-every N] [--step-sleep S] [--epoch-steps N]
                                       [--seed N]
"""

import argparse
import hashlib
import os
import time

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

BATCH = 4


def say(line):
    """One line in one write: the ranks share stdout, and under PYTHONUNBUFFERED print() writes the text and its
    newline separately, so lines of two ranks could interleave."""
    print(line + "\n", end="", flush=True)


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                                       torch.nn.Tanh(), torch.nn.Linear(64, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class StepPrinter(Callback):
    """Prints where fit resumed from and each step; sleeps after each step (--step-sleep: room for faults)."""

    def __init__(self, sleep):
        self.sleep = sleep

    def on_train_start(self, trainer, pl_module):
        say(f"RESUMED_FROM={trainer.ckpt_path or 'none'}")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        say(f"[rank{trainer.global_rank}] step {trainer.global_step}/{trainer.max_steps} "
            f"epoch {trainer.current_epoch} loss {outputs['loss'].item():.6f}")
        if self.sleep:
            time.sleep(self.sleep)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        say(f"[rank{trainer.global_rank}] saving a checkpoint at step {trainer.global_step}")


def params_sha256(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    parser = argparse.ArgumentParser(description="PyTorch Lightning DDP on CPU")
    parser.add_argument("--out", default="/checkpoints/lightning", help="ModelCheckpoint dirpath")
    parser.add_argument("--steps", type=int, default=60, help="Trainer max_steps")
    parser.add_argument("--save-every", type=int, default=20, help="ModelCheckpoint every_n_train_steps")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds of sleep after each step")
    parser.add_argument("--epoch-steps", type=int, default=None,
                        help="optimizer steps per epoch (default: --save-every, every checkpoint at an epoch end)")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))

    L.seed_everything(args.seed, workers=True)
    model = Regressor()
    samples = (args.epoch_steps or args.save_every) * BATCH * world
    generator = torch.Generator().manual_seed(args.seed)
    x = torch.randn(samples, 16, generator=generator)
    y = torch.sin(x.sum(dim=1, keepdim=True))
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True)  # Lightning adds a DistributedSampler

    checkpoint = ModelCheckpoint(dirpath=args.out, every_n_train_steps=args.save_every, save_last=True, save_top_k=-1)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=local_world,
        num_nodes=world // local_world,
        strategy=DDPStrategy(process_group_backend="gloo"),
        max_steps=args.steps,
        callbacks=[StepPrinter(args.step_sleep), checkpoint],
        deterministic=True,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=args.out,
    )
    last = os.path.join(args.out, "last.ckpt")
    trainer.fit(model, loader, ckpt_path="last" if os.path.exists(last) else None)

    if trainer.global_rank == 0:
        say(f"FINAL_PARAMS_SHA256={params_sha256(model)}")


if __name__ == "__main__":
    main()

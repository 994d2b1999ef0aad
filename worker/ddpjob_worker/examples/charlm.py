"""Example trainer: a small character-level transformer on a bundled text, trained with DDP under torchrun and
made restart-proof by the checkpoint library (``python -m ddpjob_worker.examples.charlm --help``).

It is deterministic for a given ``--seed`` and world size: a run that is killed and resumed ends with the
same parameters, bit for bit, as one that was never interrupted (tests/worker check exactly that).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import math
import os
import socket
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

from ddpjob_worker.checkpoint import CheckpointConfig, Checkpointer, TrainState
from ddpjob_worker.globalbatch import BatchPlan, plan_batches
from ddpjob_worker.logs import get_logger
from ddpjob_worker.progress import ProgressReporter
from ddpjob_worker.sampler import ElasticDistributedSampler

log = get_logger("charlm")
DEFAULT_TEXT = Path(__file__).parent / "data" / "keeper.txt"


class CharChunks(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Non-overlapping windows of ``seq_len + 1`` characters: input and next-character target."""

    def __init__(self, text: str, seq_len: int) -> None:
        self.vocab = sorted(set(text))
        index = {c: i for i, c in enumerate(self.vocab)}
        self.data = torch.tensor([index[c] for c in text], dtype=torch.long)
        self.seq_len = seq_len

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.seq_len

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.data[i * self.seq_len : i * self.seq_len + self.seq_len + 1]
        return chunk[:-1], chunk[1:]


class CharTransformer(nn.Module):
    """A decoder-only transformer (causal self-attention) over characters."""

    def __init__(self, vocab: int, seq_len: int, d_model: int, layers: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(seq_len, d_model))
        block = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        h = self.embed(x) + self.pos[:n]
        mask = self.get_buffer("mask")
        h = self.blocks(h, mask=mask[:n, :n], is_causal=True)
        out: torch.Tensor = self.head(h)
        return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ddpjob_worker.examples.charlm", description=__doc__)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps-per-epoch", type=int, default=0, help="cap steps per epoch (0: the whole text)")
    p.add_argument("--batch-size", type=int, default=32, help="per rank (with --global-batch: the most per rank)")
    p.add_argument("--global-batch", type=int, default=0,
                   help="samples per optimizer step, all ranks together, whatever the world size: gradient "
                        "accumulation makes up the difference (0: --batch-size per rank, no accumulation)")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--text", type=Path, default=DEFAULT_TEXT)
    p.add_argument("--checkpoint-dir", default=None, help="default: $DDPJOB_CHECKPOINT_DIR or ./checkpoints")
    p.add_argument("--checkpoint-every", type=int, default=50, help="save every N steps (0: only at epoch ends)")
    p.add_argument("--async-save", action="store_true", help="write checkpoints in a background thread")
    p.add_argument("--save-final", type=Path, default=None, help="rank 0 writes the final parameters here")
    p.add_argument("--step-delay", type=float, default=0.0, help="sleep after each step (tests: kill mid-epoch)")
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--eval-samples", type=int, default=0,
                   help="at the end rank 0 logs the mean loss over the first N samples, dropout off (0: none)")
    p.add_argument("--record-samples", type=Path, default=None,
                   help="tests: each rank appends the sample indices of every step to a JSON-lines file here")
    p.add_argument("--hang-at-step", type=int, default=0,
                   help="tests: at this global step every rank sleeps forever unless --hang-marker exists")
    p.add_argument("--hang-marker", type=Path, default=None,
                   help="created by rank 0 when it hangs, so the restarted run goes past the step; must be visible "
                        "to rank 0 after the restart (a shared volume), or the job hangs again")
    p.add_argument("--pause-at-step", type=int, default=0,
                   help="tests: at this global step the last rank sleeps --pause-seconds once (a slow step, a "
                        "long save, a GC pause: the others wait for it in the next collective)")
    p.add_argument("--pause-seconds", type=float, default=0.0)
    args = p.parse_args(argv)
    if args.hang_at_step and args.hang_marker is None:
        p.error("--hang-at-step needs --hang-marker")
    if args.global_batch < 0 or args.batch_size < 1:
        p.error("--global-batch must be >= 0 and --batch-size >= 1")
    return args


def setup_distributed() -> torch.device:
    """gloo on CPU, nccl on GPU; a plain single process when not started by torchrun."""
    if "RANK" not in os.environ:
        return torch.device("cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    # A short collective timeout: a dead peer is then an error within a minute (and a torchrun restart),
    # not a 30-minute hang.
    # device_id binds the NCCL communicator to this rank's GPU at once (torch otherwise guesses it at the first
    # barrier, with a warning, as the first GPU run showed).
    dist.init_process_group(backend, timeout=timedelta(seconds=120),
                            device_id=device if device.type == "cuda" else None)
    return device


def make_data(args: argparse.Namespace, world: int, rank: int, plan: BatchPlan
              ) -> tuple[CharChunks, ElasticDistributedSampler, DataLoader[Any], int]:
    """Dataset, this rank's sampler and loader (of micro-batches), and the optimizer steps per epoch (draws
    nothing from the global RNG)."""
    dataset = CharChunks(args.text.read_text(encoding="utf-8"), args.seq_len)
    sampler = ElasticDistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=args.seed,
                                        drop_last=True)
    # Its own generator: a DataLoader otherwise draws its base seed from the global torch RNG each time an
    # epoch's iterator is created, which a mid-epoch resume does at a different point of the RNG stream.
    loader = DataLoader(dataset, batch_size=plan.micro_batch, sampler=sampler, drop_last=True,
                        generator=torch.Generator().manual_seed(args.seed))
    steps_per_epoch = len(dataset) // plan.global_batch
    if args.steps_per_epoch:
        steps_per_epoch = min(steps_per_epoch, args.steps_per_epoch)
    return dataset, sampler, loader, steps_per_epoch


@dataclass
class Run:
    """What the epoch loop works with."""

    args: argparse.Namespace
    device: torch.device
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler | None
    ckpt: Checkpointer
    reporter: ProgressReporter
    sampler: ElasticDistributedSampler
    loader: DataLoader[Any]
    plan: BatchPlan
    steps_per_epoch: int
    record: SampleRecord | None


def train(args: argparse.Namespace) -> None:
    device = setup_distributed()
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    try:
        plan = plan_batches(world, args.batch_size, args.global_batch)
    except ValueError as err:
        raise SystemExit(f"--global-batch: {err}") from None
    torch.manual_seed(args.seed)  # same initial weights on every rank (DDP also broadcasts rank 0's)
    dataset, sampler, loader, steps_per_epoch = make_data(args, world, rank, plan)
    model: nn.Module = CharTransformer(len(dataset.vocab), args.seq_len, args.d_model, args.layers, args.heads,
                                       args.dropout).to(device)
    if dist.is_initialized():
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    # In optimizer steps: with --global-batch the steps per epoch, and so the schedule, do not depend on the world
    # size (without it a world-size change keeps the checkpoint's T_max, planned for the old steps per epoch).
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, args.epochs * steps_per_epoch))
    scaler = torch.amp.GradScaler("cuda") if device.type == "cuda" else None
    torch.manual_seed(args.seed + 1000 + rank)  # dropout differs per rank; restored per rank on resume
    config = CheckpointConfig.from_env(every_steps=args.checkpoint_every, async_save=args.async_save,
                                       **({"directory": args.checkpoint_dir} if args.checkpoint_dir else {}))
    ckpt = Checkpointer(config, model=model, optimizer=optimizer, lr_scheduler=scheduler, grad_scaler=scaler)
    record = SampleRecord.open(args.record_samples, rank, world) if args.record_samples else None
    reporter = ProgressReporter(total_steps=args.epochs * steps_per_epoch)  # the bar and ETA of kubectl ddpjob
    run = Run(args, device, model, optimizer, scheduler, scaler, ckpt, reporter, sampler, loader, plan,
              steps_per_epoch, record)
    state = ckpt.resume()
    run.reporter.resumed(seconds=ckpt.last_load_seconds)
    log.info("training: world %d, %d steps/epoch of %d samples (%d per rank: %d x %d), epochs %d..%d, device %s",
             world, steps_per_epoch, plan.global_batch, plan.per_rank, plan.accumulation, plan.micro_batch,
             state.epoch, args.epochs - 1, device)
    loss_value = math.nan
    for epoch in range(state.epoch, args.epochs):
        loss_value = run_epoch(run, state, epoch, loss_value)
        state.next_epoch()
        if ckpt.preempted():
            ckpt.exit_preempted(state)
        ckpt.save(state)
        run.reporter.report(epoch=state.epoch, step=0, global_step=state.global_step, loss=loss_value,
                            checkpoint_step=ckpt.last_saved_step, checkpoint_time=ckpt.last_saved_time,
                            checkpoint_seconds=ckpt.last_save_seconds, force=True)
    ckpt.close()
    finish(run, rank, dataset, state.global_step, loss_value)


def run_epoch(run: Run, state: TrainState, epoch: int, loss_value: float) -> float:
    """The optimizer steps of ``epoch`` from the checkpoint's position; returns the last step's loss."""
    args, sampler, plan = run.args, run.sampler, run.plan
    # The epoch in samples of its order, all ranks together: a world-size change mid-epoch resumes at the next
    # unseen sample (ElasticDistributedSampler) and the epoch ends where it would have.
    epoch_samples = run.steps_per_epoch * plan.global_batch
    # A checkpoint older than samples_in_epoch has only the steps, of this same world size and batch.
    sampler.set_epoch(epoch, consumed=state.samples_in_epoch or state.step_in_epoch * plan.global_batch)
    indices = sampler.rank_indices() if run.record else []
    run.model.train()
    started = time.monotonic()
    for i, batches in enumerate(grouped(run.loader, plan.accumulation), start=1):
        if state.samples_in_epoch >= epoch_samples or len(batches) < plan.accumulation:
            break
        loss_value = train_step(run.model, run.optimizer, run.scaler, batches, run.device)
        run.scheduler.step()
        state.step_in_epoch += 1
        state.global_step += 1
        state.samples_in_epoch = sampler.position(i * plan.per_rank)
        if run.record:
            run.record.step(epoch, state.global_step, indices[(i - 1) * plan.per_rank:i * plan.per_rank])
        if state.global_step % args.log_every == 0:
            log.info("epoch %d step %d/%d loss %.4f (%.1f steps/s)", epoch, state.step_in_epoch,
                     run.steps_per_epoch, loss_value, i / (time.monotonic() - started))
        if args.step_delay:
            time.sleep(args.step_delay)
        if state.samples_in_epoch < epoch_samples:  # the epoch's last step is saved by the caller, as epoch+1
            saved_before = run.ckpt.last_saved_step
            run.ckpt.after_step(state)
            run.reporter.report(epoch=epoch, step=state.step_in_epoch, global_step=state.global_step,
                                loss=loss_value, checkpoint_step=run.ckpt.last_saved_step,
                                checkpoint_time=run.ckpt.last_saved_time,
                                checkpoint_seconds=run.ckpt.last_save_seconds,
                                force=run.ckpt.last_saved_step != saved_before)
        hang_if_asked(args, state.global_step, run.device)
        pause_if_asked(args, state.global_step)
    return loss_value


def finish(run: Run, rank: int, dataset: CharChunks, steps: int, loss_value: float) -> None:
    """Rank 0 logs the parameters' digest (and the eval loss, --eval-samples) and writes --save-final."""
    params = {k: v.detach().cpu() for k, v in getattr(run.model, "module", run.model).state_dict().items()}
    if rank == 0:
        # In the log too: a run whose checkpoints lived on per-pod volumes leaves no file anyone can read later.
        log.info("final parameters sha256 %s", params_sha256(params))
        if run.args.eval_samples:
            log.info("final eval loss %.6f over %d samples", eval_loss(run.model, dataset, run.args.eval_samples,
                                                                       run.device), run.args.eval_samples)
    if rank == 0 and run.args.save_final is not None:
        torch.save(params, run.args.save_final)
        log.info("final parameters written to %s", run.args.save_final)
    log.info("done: %d steps, final loss %.4f", steps, loss_value)
    if dist.is_initialized():
        dist.destroy_process_group()


def grouped(loader: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """The loader's micro-batches, ``size`` at a time (the last group may be short)."""
    it = iter(loader)
    while group := list(itertools.islice(it, size)):
        yield group


@torch.no_grad()
def eval_loss(model: nn.Module, dataset: CharChunks, samples: int, device: torch.device) -> float:
    """Mean cross-entropy over the dataset's first ``samples`` chunks, dropout off (the same on every run)."""
    module = getattr(model, "module", model)
    module.eval()
    total, count = 0.0, 0
    for first in range(0, min(samples, len(dataset)), 64):
        xs, ys = zip(*(dataset[i] for i in range(first, min(first + 64, samples, len(dataset)))), strict=True)
        x, y = torch.stack(xs).to(device), torch.stack(ys).to(device)
        logits = module(x)
        total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum"))
        count += y.numel()
    return total / max(1, count)


class SampleRecord:
    """--record-samples: one JSON line per optimizer step with the indices this rank consumed in it and its group
    (rank 0's rendezvous time), so a test can keep each step from the last group that did it."""

    def __init__(self, path: Path, rank: int, world: int, group: str) -> None:
        self.out, self.rank, self.world, self.group = path.open("a", encoding="utf-8"), rank, world, group

    @classmethod
    def open(cls, directory: Path, rank: int, world: int) -> SampleRecord:
        shared = [os.environ.get("DDPJOB_RENDEZVOUS_TIME", f"{time.time():.3f}")]
        if dist.is_initialized():
            dist.broadcast_object_list(shared, src=0)
        directory.mkdir(parents=True, exist_ok=True)
        return cls(directory / f"rank-{rank}-{socket.gethostname()}-{os.getpid()}.jsonl", rank, world, shared[0])

    def step(self, epoch: int, global_step: int, indices: list[int]) -> None:
        self.out.write(json.dumps({"epoch": epoch, "step": global_step, "world": self.world, "rank": self.rank,
                                   "group": self.group, "indices": indices}) + "\n")
        self.out.flush()


def params_sha256(params: dict[str, torch.Tensor]) -> str:
    """A digest of every tensor's exact bytes (names sorted, with dtype and shape): equal means bitwise equal."""
    digest = hashlib.sha256()
    for name in sorted(params):
        t = params[name].contiguous()
        digest.update(name.encode())
        digest.update(str(t.dtype).encode())
        digest.update(str(tuple(t.shape)).encode())
        digest.update(t.numpy().tobytes())
    return digest.hexdigest()


def pause_if_asked(args: argparse.Namespace, global_step: int) -> None:
    """Tests of false alarms: the last rank takes ``--pause-seconds`` at ``--pause-at-step``, in this process only
    (a restarted group that passes the step again does not pause)."""
    if not args.pause_at_step or global_step != args.pause_at_step or getattr(args, "paused", False):
        return
    args.paused = True
    if int(os.environ.get("RANK", "0")) == int(os.environ.get("WORLD_SIZE", "1")) - 1:
        log.warning("pausing %.1fs at step %d on purpose (--pause-at-step)", args.pause_seconds, global_step)
        time.sleep(args.pause_seconds)


def hang_if_asked(args: argparse.Namespace, global_step: int, device: torch.device) -> None:
    """Tests of hang detection: at ``--hang-at-step`` every rank sleeps forever with no collective pending,
    unless the marker exists. Rank 0 decides (and creates the marker first) and a broadcast makes every rank
    decide the same; no random number is drawn, so the training math is unchanged."""
    if not args.hang_at_step or global_step != args.hang_at_step:
        return
    hang = 0.0
    if int(os.environ.get("RANK", "0")) == 0 and not args.hang_marker.exists():
        args.hang_marker.touch()
        hang = 1.0
    if dist.is_initialized():
        decision = torch.tensor([hang], device=device)
        dist.broadcast(decision, src=0)
        hang = float(decision.item())
    if hang:
        log.warning("hanging at step %d on purpose (--hang-at-step; %s now exists)", global_step, args.hang_marker)
        while True:
            time.sleep(3600)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None,
               batches: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device) -> float:
    """One optimizer step on this rank's micro-batches: each one's loss is scaled by 1/len(batches), and DDP
    all-reduces the gradients once, after the last (no_sync before it), so the step averages the gradients of
    every sample of the global batch, as one big batch would. Returns this rank's mean loss."""
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for j, (x, y) in enumerate(batches):
        sync = j == len(batches) - 1 or not isinstance(model, DDP)
        with contextlib.nullcontext() if sync else model.no_sync():  # type: ignore[operator]
            with torch.autocast(device_type=device.type, enabled=scaler is not None):
                logits = model(x.to(device))
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.to(device).reshape(-1))
            if len(batches) > 1:
                loss = loss / len(batches)
            if scaler is not None:
                scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
            else:
                loss.backward()  # type: ignore[no-untyped-call]
        total += float(loss.detach())
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    return total


def main(argv: Sequence[str] | None = None) -> None:
    train(parse_args(argv))


if __name__ == "__main__":
    main()

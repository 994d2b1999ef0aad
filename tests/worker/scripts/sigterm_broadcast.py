"""Test script: stops the way PyTorch Lightning (>= 2.5, lightning/pytorch/trainer/connectors/signal_connector.py
and loops/training_epoch_loop.py) stops a DDP run when one rank receives SIGTERM, with nothing of ddpjob in it.
The signalled rank's handler sets ``received_sigterm`` and broadcasts a flag from rank 0; every step starts with a
broadcast of rank 0's flag, and a rank that reads 1 (or got the signal itself) raises ``SIGTERMException``, a
``SystemExit`` without a code, from inside ``_call_and_handle_interrupt(trainer, ...)``: its process exits 0.

Arguments: total_steps sleep_seconds. Prints ``STEP n rank r`` each step and ``DONE rank r`` at the end."""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from types import FrameType

import torch
import torch.distributed as dist


class SIGTERMException(SystemExit):  # lightning.pytorch.utilities.exceptions
    pass


class Trainer:
    received_sigterm = False


total, pause = int(sys.argv[1]), float(sys.argv[2])
dist.init_process_group("gloo")
rank = dist.get_rank()
trainer = Trainer()


def on_sigterm(signum: int, frame: FrameType | None) -> None:  # _sigterm_notifier_fn
    dist.broadcast(torch.tensor([1]), src=0)
    trainer.received_sigterm = True


signal.signal(signal.SIGTERM, on_sigterm)


def fit() -> None:
    for step in range(1, total + 1):
        flag = torch.tensor([1 if trainer.received_sigterm else 0])
        try:  # _broadcast_sigterm_tensor
            dist.broadcast(flag, src=0)
        except Exception:
            flag = torch.tensor([0])
        if flag.item() == 1:
            with contextlib.suppress(Exception):
                dist.barrier()
            raise SIGTERMException()
        grad = torch.ones(4)
        dist.all_reduce(grad)
        print(f"STEP {step} rank {rank}", flush=True)
        if trainer.received_sigterm:
            raise SIGTERMException
        time.sleep(pause)


def _call_and_handle_interrupt(trainer: Trainer) -> None:
    try:
        fit()
    except BaseException:
        raise  # Lightning tears down, then re-raises


_call_and_handle_interrupt(trainer)
print(f"DONE rank {rank}", flush=True)
dist.destroy_process_group()

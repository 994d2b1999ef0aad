"""Every RNG state a resumed run must get back to draw the same numbers: Python's, numpy's legacy global one,
torch's CPU generator and the current CUDA device's (checkpoint.py saves them per rank).

When the world size changed since the checkpoint, no rank's old stream is "its own" any more, and handing out old
states modulo the old world size would give two ranks the same stream (the same dropout masks on different data).
``derive_rng`` instead seeds every generator of new rank r from a digest of all the checkpoint's states, the new
world size and r: deterministic (the same checkpoint and world size give the same streams on every resume),
distinct per rank, and tied to where the run was, not to a constant seed."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch


def capture_rng(device: torch.device | None = None) -> dict[str, Any]:
    """This process's RNG states (python, numpy legacy global, torch CPU, and CUDA: that of ``device``, the
    model's, when it is a GPU; else the current device's). The model's device, not the current one: a script
    that never calls torch.cuda.set_device (the DDP tutorial's) draws on cuda:RANK while the current device is
    cuda:0 on every rank.

    Args:
        device: The model's device; None: the current CUDA device's state, if CUDA is initialized.

    Returns:
        The states by generator (``python``, ``numpy``, ``torch``, and ``cuda`` where it applies), for restore_rng.
    """
    np_state = np.random.get_state(legacy=True)
    assert isinstance(np_state, tuple)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (str(np_state[0]), torch.from_numpy(np.asarray(np_state[1], dtype=np.int64)),
                  int(np_state[2]), int(np_state[3]), float(np_state[4])),
        "torch": torch.get_rng_state(),
    }
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    elif torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: Mapping[str, Any], device: torch.device | None = None) -> None:
    """Inverse of capture_rng (the same ``device``)."""
    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.cpu().numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        cuda = device if device is not None and device.type == "cuda" else "cuda"
        torch.cuda.set_rng_state(state["cuda"].cpu(), cuda)


def derived_seed(states: Sequence[Mapping[str, Any]], rank: int, world: int) -> int:
    """The seed of new rank ``rank`` of ``world`` from a checkpoint's per-rank ``states``: a digest of every
    state's torch CPU generator, the world size and the rank (64 bits)."""
    digest = hashlib.sha256(b"ddpjob rng after a world-size change")
    for state in states:
        digest.update(state["torch"].cpu().numpy().tobytes())
    digest.update(f"{world}/{rank}".encode())
    return int.from_bytes(digest.digest()[:8], "little")


def derive_rng(states: Sequence[Mapping[str, Any]], rank: int, world: int) -> int:
    """Seed python's, numpy's legacy global and torch's generators (CPU and every CUDA device) of new rank
    ``rank`` of ``world`` from ``states`` (a checkpoint written by another world size); returns the seed."""
    seed = derived_seed(states, rank, world)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device's generator
    return seed

"""The writer's side of a save that the training loop should not wait for or miss: the host copy an asynchronous
save is written from, the thread that writes it, and the collective that makes any writer's failure every rank's.

Training keeps changing the live tensors while the background writer serializes, so the writer needs a copy. A
fresh copy per save would page-fault a new state-sized allocation each time (most of the time the training loop
is blocked) and briefly hold two copies while the old one is freed; instead each tensor is copied into the buffer
of the same name kept from the previous save. Host memory is therefore bounded by one state's tensor bytes per
writer rank (non-writers stage nothing), held from the first asynchronous save until ``Checkpointer.close``.
Buffers for CUDA tensors are pinned, so the device-to-host copy is a DMA; CPU tensors go to plain private memory,
on huge pages when large (the writer is a thread of the same process, so nothing needs shared memory). One write is
in flight at most: the next one waits for it, because it reads the buffers until it is done.
"""

from __future__ import annotations

import math
import mmap
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import torch
import torch.distributed as dist

from ddpjob_worker import fencing
from ddpjob_worker.logs import get_logger

log = get_logger("checkpoint")

#: Where a tensor sits in the state: the dict keys and list positions leading to it.
Key = tuple[Any, ...]
#: Characters of a writer's error message that reach the other ranks.
_MAX_CAUSE = 500
#: Buffers at least this large get transparent huge pages where the kernel offers them (Linux, THP "madvise" or
#: "always"): the first save then faults 2 MB pages instead of 4 KB ones, about half its stall for 1 GB here.
_HUGE_PAGES_FROM = 4 << 20


def _host_buffer(shape: torch.Size, dtype: torch.dtype, pin: bool) -> torch.Tensor:
    """An uninitialized contiguous host tensor: pinned for a CUDA source, else on huge pages if it is large."""
    nbytes = math.prod(shape) * dtype.itemsize
    if pin or nbytes < _HUGE_PAGES_FROM or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty(shape, dtype=dtype, device="cpu", pin_memory=pin)
    # Private, not shared: shared anonymous memory is shmem, which gets no huge pages by default.
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(region, dtype=dtype).view(shape)  # the tensor keeps the mapping alive


def _stageable(tensor: torch.Tensor) -> bool:
    """A plain dense tensor; anything else (sparse, quantized, tensor subclasses) gets a fresh copy each save."""
    return type(tensor) is torch.Tensor and tensor.layout == torch.strided and not tensor.is_quantized


def _alias(tensor: torch.Tensor) -> Hashable:
    """Equal for tensors that view the same memory in the same way: tied weights appear in a state_dict as separate
    ``detach()``-ed tensors of one storage, which torch.save stores once, and so does staging."""
    if not _stageable(tensor):
        return id(tensor)
    return (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
            tensor.stride(), tensor.dtype)


class StagingBuffers:
    """Host buffers for a state dict's tensors, kept by their place in the state and reused while shape and dtype
    stay the same."""

    def __init__(self) -> None:
        self._buffers: dict[Key, torch.Tensor] = {}

    @property
    def nbytes(self) -> int:
        """Host memory the buffers hold now."""
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def stage(self, state: Any) -> Any:
        """``state`` with every tensor copied to host memory (dicts, lists and tuples rebuilt, other values
        shared); returns once the copies are complete. Buffers of tensors the state no longer has are freed."""
        used: dict[Key, torch.Tensor] = {}
        seen: dict[Hashable, torch.Tensor] = {}
        staged = self._copy(state, (), used, seen)
        if torch.cuda.is_available() and any(b.is_pinned() for b in used.values()):
            torch.cuda.synchronize()  # the non_blocking device-to-host copies must land before the writer reads
        self._buffers = used
        return staged

    def _copy(self, obj: Any, key: Key, used: dict[Key, torch.Tensor], seen: dict[Hashable, torch.Tensor]) -> Any:
        if isinstance(obj, torch.Tensor):
            alias = _alias(obj)
            if alias not in seen:
                seen[alias] = self._copy_tensor(obj.detach(), key, used)
            return seen[alias]
        if isinstance(obj, dict):
            staged = {k: self._copy(v, (*key, k), used, seen) for k, v in obj.items()}
            if not isinstance(obj, OrderedDict):
                return staged
            # A module's state_dict: keep its type and the per-module versions that load_state_dict reads, so an
            # asynchronous checkpoint holds what a synchronous one does.
            ordered = OrderedDict(staged)
            if hasattr(obj, "_metadata"):
                ordered._metadata = obj._metadata  # type: ignore[attr-defined]
            return ordered
        if isinstance(obj, list):
            return [self._copy(v, (*key, i), used, seen) for i, v in enumerate(obj)]
        if isinstance(obj, tuple):
            return tuple(self._copy(v, (*key, i), used, seen) for i, v in enumerate(obj))
        return obj

    def _copy_tensor(self, tensor: torch.Tensor, key: Key, used: dict[Key, torch.Tensor]) -> torch.Tensor:
        if not _stageable(tensor):
            return tensor.to("cpu", copy=True)
        pin = tensor.is_cuda
        buffer = self._buffers.get(key)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype or buffer.is_pinned() != pin:
            buffer = _host_buffer(tensor.shape, tensor.dtype, pin)
        buffer.copy_(tensor, non_blocking=pin)
        used[key] = buffer
        return buffer


class BackgroundWriter:
    """One asynchronous write at a time, from staging buffers that the next write reuses."""

    def __init__(self) -> None:
        self.staging = StagingBuffers()
        self._thread: threading.Thread | None = None

    def start(self, payload: Any, write: Callable[[Any], None], failed: Callable[[BaseException], None]) -> None:
        """Stage ``payload`` (the part the training loop waits for), then ``write`` the staged copy in a thread,
        calling ``failed`` with its error if it raises."""
        self.join()  # the previous write reads the buffers until it is done
        staged = self.staging.stage(payload)
        self._thread = threading.Thread(target=self._run, args=(write, staged, failed), name="ddpjob-ckpt-writer",
                                        daemon=True)
        self._thread.start()

    @staticmethod
    def _run(write: Callable[[Any], None], staged: Any, failed: Callable[[BaseException], None]) -> None:
        try:
            write(staged)
        except BaseException as err:  # a thread's exception would otherwise only reach stderr
            failed(err)

    def join(self) -> None:
        """Wait for the write in flight, if any."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None


class CheckpointSaveFailed(RuntimeError):
    """A save failed on some writer rank; every rank raises this, with the same message.

    Args:
        failures: (writer rank, step, cause) for each writer whose save failed.
    """

    def __init__(self, failures: list[tuple[int, int, str]]) -> None:
        #: (writer rank, step, cause) for each writer whose save failed.
        self.failures = failures
        detail = "; ".join(f"step-{step} on rank {rank}: {cause}" for rank, step, cause in failures)
        super().__init__(f"saving a checkpoint failed: {detail}")


class SaveFailures:
    """This rank's failed save, kept until every rank has learnt of it."""

    def __init__(self, rank: int, device: torch.device, group: Any = None) -> None:
        self._rank = rank
        # On replicas.object_group's gloo group (a GPU job's side group) the flag lives in host memory.
        self._device = device if group is None else torch.device("cpu")
        self._group = group
        self._failed: tuple[int, BaseException] | None = None

    def record(self, step: int, err: BaseException) -> None:
        """Log a failed save of ``step`` and keep it for ``raise_everywhere`` (called from the writer thread too)."""
        self._failed = (step, err)
        log.error("checkpoint step-%d %s: %s", step, "not committed" if isinstance(err, fencing.Fenced) else "failed",
                  err)

    def raise_everywhere(self) -> None:
        """Raise CheckpointSaveFailed on every rank if any rank recorded a failure (its own error is the cause on
        the rank that had it). Collective when torch.distributed is initialized: one small all-reduce when nothing
        failed, plus a gather of the messages when something did."""
        failed, self._failed = self._failed, None
        mine = None if failed is None else (self._rank, failed[0],
                                            f"{type(failed[1]).__name__}: {failed[1]}"[:_MAX_CAUSE])
        failures = [mine] if mine is not None else []
        if dist.is_available() and dist.is_initialized():
            flag = torch.tensor([0.0 if mine is None else 1.0], device=self._device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
            if flag.item() > 0:
                gathered: list[Any] = [None] * dist.get_world_size()
                dist.all_gather_object(gathered, mine, group=self._group)
                failures = [f for f in gathered if f is not None]
        if failures:
            raise CheckpointSaveFailed(failures) from (failed[1] if failed is not None else None)

"""Benchmark: checkpoint save/load throughput against the disk's own sequential write/read speed, measured in
the same run on the same directory (``python bench/checkpoint_bench.py --dir /path/on/the/volume``).

Save = serialize + SHA-256 + fsync + rename (what ``Checkpointer.save`` does); load = checksum verify +
``torch.load`` (what ``Checkpointer.resume`` does). Page cache is dropped for the files read (fadvise), so
reads come from the disk, as after a pod restart on another node.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
from ddpjob_worker.checkpoint import CheckpointConfig, Checkpointer, TrainState

MB = 1 << 20
CHUNK = 8 * MB


def drop_cache(path: Path) -> None:
    """Evict a file's pages from the page cache (works unprivileged for clean pages)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def disk_write(path: Path, size: int) -> float:
    """Seconds to write ``size`` bytes sequentially and fsync them."""
    block = os.urandom(CHUNK)
    start = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        for _ in range(size // CHUNK):
            f.write(block)
        os.fsync(f.fileno())
    return time.perf_counter() - start


def disk_read(path: Path) -> float:
    drop_cache(path)
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(CHUNK):
            pass
    return time.perf_counter() - start


class Blob(torch.nn.Module):
    """A model whose state is ``size`` bytes in 64 MB float32 buffers."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        for i in range(max(1, size // (64 * MB))):
            self.register_buffer(f"b{i}", torch.rand(64 * MB // 4))


def bench(directory: Path, size: int, repeats: int) -> dict[str, float]:
    raw = directory / "raw.bin"
    w = min(disk_write(raw, size) for _ in range(repeats))
    r = min(disk_read(raw) for _ in range(repeats))
    raw.unlink()
    model = Blob(size)
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    ckdir = directory / "ckpt"
    saves, blocked, loads = [], [], []
    for i in range(repeats):
        ckpt = Checkpointer(CheckpointConfig(directory=str(ckdir), keep=1, handle_sigterm=False), model=model)
        start = time.perf_counter()
        ckpt.save(TrainState(global_step=10 * i + 1))
        saves.append(time.perf_counter() - start)
        for payload in ckdir.glob("step-*/state.pt"):
            drop_cache(payload)
        start = time.perf_counter()
        Checkpointer(CheckpointConfig(directory=str(ckdir), keep=1, handle_sigterm=False), model=model).resume()
        loads.append(time.perf_counter() - start)
        async_ckpt = Checkpointer(CheckpointConfig(directory=str(ckdir), keep=1, async_save=True,
                                                   handle_sigterm=False), model=model)
        start = time.perf_counter()
        async_ckpt.save(TrainState(global_step=10 * i + 2))
        blocked.append(time.perf_counter() - start)
        async_ckpt.wait()
    shutil.rmtree(ckdir)
    return {"bytes": nbytes, "disk_w": size / w / MB, "disk_r": size / r / MB, "save": nbytes / min(saves) / MB,
            "load": nbytes / min(loads) / MB, "async_block_s": min(blocked), "save_s": min(saves)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", type=Path, default=None, help="directory on the disk to measure (default: a temp dir)")
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--repeats", type=int, default=3, help="best of N")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        rows = [bench(Path(tmp), mb * MB, args.repeats) for mb in args.sizes_mb]
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; best of {args.repeats}")
    print(f"{'state':>8} | {'disk write':>10} | {'save':>16} | {'disk read':>10} | {'load (verify+load)':>20} | "
          f"{'async save blocks':>17}")
    for mb, row in zip(args.sizes_mb, rows, strict=True):
        save_share, load_share = row["save"] / row["disk_w"], row["load"] / row["disk_r"]
        print(f"{mb:>5} MB | {row['disk_w']:>6.0f} MB/s | {row['save']:>6.0f} MB/s ({save_share:>4.0%}) | "
              f"{row['disk_r']:>6.0f} MB/s | {row['load']:>8.0f} MB/s ({load_share:>4.0%}) | "
              f"{row['async_block_s']:>6.2f} s of {row['save_s']:.2f} s")


if __name__ == "__main__":
    main()

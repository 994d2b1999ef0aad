"""Benchmark: checkpoint save/load throughput against the disk's own sequential write/read speed, and how long an
asynchronous save blocks training, measured in one run on one directory
(``python bench/checkpoint_bench.py --dir /path/on/the/volume``).

Disk write = ``dd if=/dev/zero bs=8M conv=fsync`` (coreutils), the same page cache + fsync path a save takes;
each dd run is interleaved with a save of the same size, so both see the same machine load. Save =
``Checkpointer.save``: serialize + SHA-256 + fsync + rename (rotation deletes nothing in the timed saves). To show
where a save's time goes, each round also times ``torch.save`` + fsync alone (no SHA-256), and the SHA-256 speed
of one core over the state in memory.
Load = checksum verify + ``torch.load`` (``Checkpointer.resume``), page cache evicted first (fadvise), as after a
pod restart on another node. Async stall = how long ``save`` blocks with ``async_save``: the first save allocates
the staging buffers, later ones reuse them; "extra peak" is the process's peak memory above its resident size
during a later asynchronous save and its background write.

``--device cuda`` keeps the state on the GPU (a save then copies it to the host first: pinned staging buffers for
an asynchronous one); ``--async-only`` skips the synchronous rows (an 8 GB state's dd and saves take minutes).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from ddpjob_worker.checkpoint import CheckpointConfig, Checkpointer, TrainState

MB = 1 << 20
CHUNK = 8 * MB
DD_COPIED = re.compile(r"^(\d+) bytes .* copied, ([\d.]+) s", re.MULTILINE)


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} (1/5/15 min) on {os.cpu_count()} CPUs"


def drop_cache(path: Path) -> None:
    """Evict a file's pages from the page cache (works unprivileged for clean pages)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def dd_write(path: Path, size: int) -> float:
    """MB/s of ``dd`` writing ``size`` bytes sequentially and fsyncing them, as dd itself reports it."""
    run = subprocess.run(["dd", "if=/dev/zero", f"of={path}", f"bs={CHUNK}", f"count={size // CHUNK}", "conv=fsync"],
                         capture_output=True, text=True, check=True, env={**os.environ, "LC_ALL": "C"})
    match = DD_COPIED.search(run.stderr)
    if match is None:
        raise RuntimeError(f"unexpected dd output: {run.stderr!r}")
    return int(match.group(1)) / float(match.group(2)) / MB


def disk_read(path: Path) -> float:
    """MB/s of reading ``path`` from the disk (page cache evicted first)."""
    drop_cache(path)
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(CHUNK):
            pass
    return path.stat().st_size / (time.perf_counter() - start) / MB


def peak_memory_reset() -> int:
    """Reset this process's peak resident size (Linux: /proc/self/clear_refs) and return the resident size, bytes."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kb("VmRSS") * 1024


def peak_memory() -> int:
    return _status_kb("VmHWM") * 1024


def _status_kb(field: str) -> int:
    match = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    assert match is not None
    return int(match.group(1))


def serialize_fsync(path: Path, state: dict[str, torch.Tensor]) -> float:
    """MB/s of ``torch.save`` (zip CRC-32 off, as the library saves) + fsync, without the SHA-256."""
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    start = time.perf_counter()
    try:
        torch.save(state, path)
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    finally:
        torch.serialization.set_crc32_options(before)
    seconds = time.perf_counter() - start
    size = path.stat().st_size
    path.unlink()
    return size / seconds / MB


def sha256_speed(state: dict[str, torch.Tensor]) -> float:
    """MB/s of SHA-256 over the state's bytes in memory (what the library's hasher thread must keep up with)."""
    digest, size = hashlib.sha256(), 0
    start = time.perf_counter()
    for tensor in state.values():
        digest.update(memoryview(tensor.cpu().numpy()).cast("B"))
        size += tensor.numel() * tensor.element_size()
    return size / (time.perf_counter() - start) / MB


class Blob(torch.nn.Module):
    """A model whose state is ``size`` bytes in 64 MB float32 buffers."""

    def __init__(self, size: int, device: str) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1, device=device))
        for i in range(max(1, size // (64 * MB))):
            self.register_buffer(f"b{i}", torch.rand(64 * MB // 4, device=device))


def checkpointer(directory: Path, model: torch.nn.Module, **config: bool | int) -> Checkpointer:
    return Checkpointer(CheckpointConfig(directory=str(directory), handle_sigterm=False, **config), model=model)


def sync_rows(directory: Path, size: int, model: Blob, repeats: int) -> dict[str, float]:
    """dd and ``Checkpointer.save`` in turns, then disk read and ``resume``: best of ``repeats`` each."""
    raw, ckdir = directory / "dd.bin", directory / "sync"
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    ckpt = checkpointer(ckdir, model, keep=repeats + 1)
    ckpt.resume()
    dd, saves, plain, sha = [], [], [], []
    for i in range(repeats):
        dd.append(dd_write(raw, size))
        raw.unlink()
        start = time.perf_counter()
        ckpt.save(TrainState(global_step=i + 1))
        saves.append(nbytes / (time.perf_counter() - start) / MB)
        plain.append(serialize_fsync(directory / "plain.pt", model.state_dict()))
        sha.append(sha256_speed(model.state_dict()))
    ckpt.close()
    dd_write(raw, size)
    reads = [disk_read(raw) for _ in range(repeats)]
    raw.unlink()
    loads = []
    for _ in range(repeats):
        for payload in ckdir.glob("step-*/state.pt"):
            drop_cache(payload)
        start = time.perf_counter()
        checkpointer(ckdir, model).resume()
        loads.append(nbytes / (time.perf_counter() - start) / MB)
    shutil.rmtree(ckdir)
    return {"dd": max(dd), "save": max(saves), "plain": max(plain), "sha": max(sha), "read": max(reads),
            "load": max(loads)}


def async_rows(directory: Path, model: Blob, repeats: int) -> dict[str, float]:
    """How long ``save`` blocks with ``async_save``: the first save, then the worst later one; the best background
    write's duration; the staging buffers' size and the extra peak memory of a later save."""
    ckpt = checkpointer(directory / "async", model, keep=2, async_save=True)
    ckpt.resume()
    start = time.perf_counter()
    ckpt.save(TrainState(global_step=1))
    first = time.perf_counter() - start
    ckpt.wait()
    stalls, writes, extra = [], [], 0
    for i in range(repeats):
        with torch.no_grad():
            model.w.add_(1.0)  # training goes on between saves
        rss = peak_memory_reset()
        start = time.perf_counter()
        ckpt.save(TrainState(global_step=i + 2))
        stalls.append(time.perf_counter() - start)
        ckpt.wait()
        writes.append(time.perf_counter() - start)
        extra = max(extra, peak_memory() - rss)
    background = ckpt._background  # the bench reports what the library keeps; not an API
    staging = background.staging.nbytes if background is not None else 0
    ckpt.close()
    shutil.rmtree(directory / "async")
    return {"first": first, "stall": max(stalls), "write": min(writes), "staging": staging / MB, "extra": extra / MB}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=None, help="directory on the disk to measure (default: a temp dir)")
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--repeats", type=int, default=3, help="best of N")
    parser.add_argument("--device", default="cpu", help="where the state lives: cpu or cuda")
    parser.add_argument("--async-only", action="store_true", help="only the asynchronous save's rows")
    args = parser.parse_args()
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)  # the temp dir inside it is removed afterwards, not the folder
    torch.set_num_threads(1)
    logging.getLogger("ddpjob").setLevel(logging.WARNING)  # one "saved" line per checkpoint would drown the table
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(f"load average at start: {load_average()}; torch {torch.__version__}; best of {args.repeats}; "
          f"state on {args.device} ({where})")
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for mb in args.sizes_mb:
            model = Blob(mb * MB, args.device)
            rows.append((mb, None if args.async_only else sync_rows(Path(tmp), mb * MB, model, args.repeats),
                         async_rows(Path(tmp), model, args.repeats)))
            del model
    if not args.async_only:
        print(f"{'state':>8} | {'dd write':>9} | {'sync save (/dd)':>17} | {'no SHA-256 (/dd)':>17} | "
              f"{'SHA-256':>9} | {'disk read':>9} | {'load (/read)':>16}")
    for mb, s, _ in rows:
        if s is None:
            continue
        print(f"{mb:>5} MB | {s['dd']:>4.0f} MB/s | {s['save']:>4.0f} MB/s ({s['save'] / s['dd']:>4.0%}) | "
              f"{s['plain']:>4.0f} MB/s ({s['plain'] / s['dd']:>4.0%}) | {s['sha']:>4.0f} MB/s | "
              f"{s['read']:>4.0f} MB/s | {s['load']:>4.0f} MB/s ({s['load'] / s['read']:>4.0%})")
    print(f"{'state':>8} | {'async stall: first save':>23} | {'later (worst)':>13} | {'background write':>16} | "
          f"{'staging':>8} | {'extra peak':>10}")
    for mb, _, a in rows:
        print(f"{mb:>5} MB | {a['first']:>21.2f} s | {a['stall']:>11.2f} s | {a['write']:>14.2f} s | "
              f"{a['staging']:>5.0f} MB | {a['extra']:>7.0f} MB")
    print(f"load average at end:   {load_average()}")


if __name__ == "__main__":
    main()

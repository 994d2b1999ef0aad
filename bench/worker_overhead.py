"""Benchmark: training steps/s of the example trainer under ``ddp-worker`` vs plain torchrun (2 agents on
localhost, gloo), and seconds from SIGKILL of a worker to the first training step after the restart, with
pre-started trainers (the default) and without (DDPJOB_WARM_TRAINERS=0), interleaved in one run
(``python bench/worker_overhead.py``)."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from ddpjob_worker import contract, procs

STEP_LINE = re.compile(r"^(\S+ \S+) INFO .*charlm: epoch \d+ step (\d+)/")
MODEL = ["--d-model", "64", "--layers", "2", "--heads", "2", "--seq-len", "64", "--batch-size", "16",
         "--checkpoint-every", "0", "--log-every", "1", "--epochs", "1"]


def env_for(workdir: Path, port: int, index: int) -> dict[str, str]:
    worker = contract.WorkerEnv(job_name="bench", namespace="local", job_uid=f"bench-{workdir.name}-{port}",
                                worker_index=index, min_nodes=2, max_nodes=2, nproc_per_node="1",
                                rdzv_endpoint=f"127.0.0.1:{port}", max_restarts=3,
                                checkpoint_dir=str(workdir / "ckpt"), progress_file=str(workdir / "progress.json"),
                                rdzv_conf="is_host=false,last_call_timeout=1")
    # Both launchers get the same thread count (2 single-process agents share this machine's CPUs), so the
    # comparison measures only what ddp-worker adds.
    return {**os.environ, **worker.to_env(), "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // 2))}


Procs = list[subprocess.Popen[bytes]]


def start(workdir: Path, via: str, steps: int, extra: list[str],
          env: dict[str, str] | None = None) -> tuple[Procs, subprocess.Popen[bytes]]:
    port = procs.free_port()
    rdzv = subprocess.Popen([sys.executable, "-m", "ddpjob_worker.rdzv", "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.wait_for_port(port, 60, rdzv)
    train = ["-m", "ddpjob_worker.examples.charlm", *MODEL, "--steps-per-epoch", str(steps), *extra]
    agents = []
    for i in range(2):
        if via == "ddp-worker":
            argv = [sys.executable, "-m", "ddpjob_worker.entrypoint", "--", "python", *train]
        else:
            argv = [sys.executable, "-m", "torch.distributed.run", "--module", *train[1:]]
        log = open(workdir / f"{via}-{i}.log", "wb")  # noqa: SIM115
        agents.append(subprocess.Popen(argv, env={**env_for(workdir, port, i), **(env or {})}, stdout=log,
                                       stderr=subprocess.STDOUT, cwd=workdir))
    return agents, rdzv


def stop(agents: list[subprocess.Popen[bytes]], rdzv: subprocess.Popen[bytes]) -> None:
    for a in agents:
        procs.stop_tree(a, grace=5)
    procs.stop_tree(rdzv, grace=2)


def steps_per_second(log: Path, skip: int) -> float:
    points = []
    for line in log.read_text(errors="replace").splitlines():
        m = STEP_LINE.match(line)
        if m:
            points.append((datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp(), int(m.group(2))))
    points = points[skip:]
    return (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0])


def throughput(workdir: Path, via: str, steps: int) -> float:
    agents, rdzv = start(workdir, via, steps, [])
    try:
        for a in agents:
            if a.wait(900) != 0:
                raise SystemExit(f"{via} run failed; see {workdir}")
    finally:
        stop(agents, rdzv)
    return steps_per_second(workdir / f"{via}-0.log", skip=10)


def _progress(path: Path) -> dict[str, int]:
    try:
        data = json.loads(path.read_text())
        return {"pid": int(data["pid"]), "step": int(data["globalStep"])}
    except (OSError, ValueError, KeyError):
        return {}


def kill_to_first_step(workdir: Path, warm: bool) -> float:
    """SIGKILL agent 1's training process once training runs (and, with ``warm``, both agents have a pre-started
    trainer waiting); seconds until rank 0 of the restarted group (a new process) reports its first step (the
    progress file is written after every step)."""
    # Many epochs: the run must outlast the wait for the pre-started trainers (the dataset caps an epoch's steps).
    agents, rdzv = start(workdir, "ddp-worker", 100000, ["--checkpoint-every", "10", "--epochs", "1000"],
                         {contract.DDPJOB_WARM_TRAINERS: "1" if warm else "0"})
    progress = workdir / "progress.json"
    try:
        while _progress(progress).get("step", 0) < 15 or (
                warm and not all(procs.standbys(a.pid, ready=True) for a in agents)):
            time.sleep(0.05)
        old_pid = _progress(progress)["pid"]
        victim = procs.training_processes(agents[1].pid)[0]
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        while _progress(progress).get("pid", old_pid) == old_pid:
            time.sleep(0.02)
        return time.monotonic() - killed
    finally:
        stop(agents, rdzv)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=2, help="throughput runs per launcher (0: skip them)")
    parser.add_argument("--kills", type=int, default=3)
    args = parser.parse_args()
    runs: dict[str, list[float]] = {"torchrun": [], "ddp-worker": []}
    recovery: dict[str, list[float]] = {"cold": [], "warm": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for n, via in enumerate(("torchrun", "ddp-worker") * args.repeats):  # interleaved: drift hits both
            (work / f"run{n}").mkdir()  # a fresh checkpoint dir: a shared one would resume the finished run
            runs[via].append(throughput(work / f"run{n}", via, args.steps))
        for i in range(args.kills):
            for kind in ("cold", "warm"):  # interleaved: drift hits both
                (work / f"kill{i}-{kind}").mkdir()
                recovery[kind].append(kill_to_first_step(work / f"kill{i}-{kind}", kind == "warm"))
    for via, values in runs.items():
        if not values:
            continue
        print(f"{via:>10}: {', '.join(f'{v:.2f}' for v in values)} steps/s (mean {sum(values) / len(values):.2f})")
    for kind, label in (("cold", "DDPJOB_WARM_TRAINERS=0"), ("warm", "pre-started trainers")):
        values = recovery[kind]
        print(f"kill -9 of a worker -> first step after restart, {label}: {', '.join(f'{s:.1f}' for s in values)} s"
              f" (median {statistics.median(values):.1f})")
    print(f"warm / cold (medians): {statistics.median(recovery['warm']) / statistics.median(recovery['cold']):.2f}")


if __name__ == "__main__":
    main()

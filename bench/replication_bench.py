"""Benchmark of the checkpoint replication (ddpjob_worker.replication; docs/checkpoints.md, "Your framework's
checkpoints"), in one run on this machine:

1. step time of a 2-agent DDP job (each agent with its own folder, as pods with an emptyDir each) that writes a
   SIZE MB checkpoint on rank 0 every N steps, with replication off and on, alternating (``--repeats``); the ratio of
   the mean step times (saves included: both runs save the same bytes) is the replication's cost to training;
2. from that run with replication on: the seconds from a checkpoint written (its trainer_state.json closed) to its
   copy whole in the other pod's folder;
3. a fresh pod's restore of one SIZE MB checkpoint: from a peer (groupsync's fetch) and from an S3 server
   (SeaweedFS, the tier's restore), each timed alone.

    python bench/replication_bench.py [--size-mb 1024] [--every 40] [--steps 160] [--repeats 2]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddpjob_worker import contract

from tests.cluster.controlplane import free_port
from tests.worker.helpers import LocalJob, wait_exit

SCRIPT = str(Path(__file__).parent / "scripts" / "big_checkpoints.py")


def train(base: Path, replicate: bool, args: argparse.Namespace) -> dict[str, object]:
    """One run of the trainer; returns its mean step time and, with replication, each checkpoint's copy lag."""
    job = LocalJob(base)
    ports = [free_port(), free_port()]
    times = base / "times.json"
    appeared: dict[tuple[int, int], float] = {}
    try:
        agents = []
        for i in range(2):
            env = {contract.DDPJOB_CHECKPOINT_DIR: str(base / f"pod-{i}"), "OUT_DIR": str(base / f"pod-{i}" / "out"),
                   contract.DDPJOB_WARM_TRAINERS: "0", contract.DDPJOB_CHECKPOINT_KEEP: "2"}
            if replicate:
                env |= {contract.DDPJOB_REPLICATION: "1", contract.DDPJOB_REPLICA_PORT: str(ports[i]),
                        contract.DDPJOB_REPLICA_PEERS: ",".join(f"127.0.0.1:{p}" for p in ports),
                        contract.DDPJOB_REPLICA_ADDRESS: "127.0.0.1"}
            agents.append(job.agent(i, ["python", SCRIPT, "unused", str(args.steps), str(args.every),
                                        str(args.size_mb), str(times)], **env))
        watcher = threading.Thread(target=_watch, args=(base, args.size_mb, appeared, agents), daemon=True)
        watcher.start()
        for a in agents:
            assert wait_exit(a, 3600, job) == 0, job.logs()[-3000:]
        watcher.join(30)
        data = json.loads(times.read_text())
    finally:
        job.close()
        for i in range(2):
            shutil.rmtree(base / f"pod-{i}", ignore_errors=True)
    ends = data["step_ends"]
    per_step = [b - a for a, b in itertools.pairwise(ends)]
    lags = []
    for step, saved in data["saves"]:
        seen = [appeared.get((pod, step)) for pod in (0, 1)]
        if all(s is not None for s in seen):  # the later of the two folders is the copy's
            lags.append(max(s for s in seen if s is not None) - saved)
    return {"mean_step_s": statistics.fmean(per_step), "wall_s": ends[-1] - ends[0], "copy_lag_s": lags}


def _watch(base: Path, size_mb: int, appeared: dict[tuple[int, int], float], agents: list) -> None:
    """When each checkpoint is whole (model.pt of its full size, trainer_state.json) in each pod's folder."""
    while any(a.poll() is None for a in agents):
        for pod in (0, 1):
            for d in (base / f"pod-{pod}" / "out").glob("checkpoint-*"):
                key = (pod, int(d.name.split("-")[1]))
                if key in appeared:
                    continue
                try:
                    whole = (d / "model.pt").stat().st_size >= size_mb << 20 and (d / "trainer_state.json").exists()
                except OSError:
                    continue
                if whole:
                    appeared[key] = time.time()
        time.sleep(0.05)


def restores(base: Path, size_mb: int) -> dict[str, float]:
    """Seconds for a fresh folder to receive one checkpoint from a peer, and from an S3 server."""
    import torch
    from ddpjob_worker.objectstore import ObjectStore, ObjectStoreConfig
    from ddpjob_worker.replication.replicator import Replicator
    from ddpjob_worker.replication.tier import Tier

    from tests.cluster.objectstore import S3Server

    holder_root, fresh_root = base / "holder", base / "fresh"
    for r in (holder_root, fresh_root):
        r.mkdir(parents=True)
    d = holder_root / "hf" / "checkpoint-10"
    d.mkdir(parents=True)
    torch.save({"weights": torch.ones(size_mb * (1 << 20) // 4)}, d / "model.pt")
    (d / "trainer_state.json").write_text('{"global_step": 10}')
    addresses: list[str] = []
    holder = Replicator(holder_root, "w0", "bench", lambda: list(addresses))
    holder.start("127.0.0.1", 0)
    fresh = Replicator(fresh_root, "w1", "bench", lambda: list(addresses))
    fresh.paused.set()  # the restore below is timed alone, not a background copy before it
    fresh.start("127.0.0.1", 0)
    addresses += [holder.address, fresh.address]
    out: dict[str, float] = {}
    with S3Server.start(base / "s3") as s3:
        try:
            holder.scan_once(force=True)
            fresh.learn(holder.inventory(), holder=holder.address)
            entries = [e for e in fresh.ledger.lagging()]
            t0 = time.monotonic()
            for e in entries:
                assert fresh.bring(e, [holder.address]), e
            out["from_peer_s"] = time.monotonic() - t0
            bucket = s3.bucket("bench")
            config = ObjectStoreConfig(endpoint=s3.endpoint, bucket=bucket, prefix="ns/job/",
                                       access_key_id=s3.access_key, secret_access_key=s3.secret_key)
            Tier(holder, ObjectStore(config)).upload_pending()
            shutil.rmtree(fresh_root / "hf")
            fresh.ledger.held.clear()
            tier = Tier(fresh, ObjectStore(config))
            files = [e for unit in tier.units().values() for e in unit]
            t0 = time.monotonic()
            for e in files:
                assert tier.restore(e), e
            out["from_object_store_s"] = time.monotonic() - t0
        finally:
            holder.stop()
            fresh.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--every", type=int, default=40, help="steps between two checkpoints")
    parser.add_argument("--steps", type=int, default=160)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=None, help="where the folders go (default: a temp dir)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="replication-bench-", dir=args.dir))
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs; "
          f"{args.size_mb} MB every {args.every} steps, {args.steps} steps, 2 agents, one folder each")
    runs: dict[bool, list[dict[str, object]]] = {False: [], True: []}
    try:
        for r in range(args.repeats):
            for replicate in (False, True):
                result = train(base / f"run-{r}-{int(replicate)}", replicate, args)
                runs[replicate].append(result)
                print(f"  run {r} replication {'on ' if replicate else 'off'}: mean step "
                      f"{float(result['mean_step_s']) * 1000:.1f} ms, wall {float(result['wall_s']):.1f} s"
                      + (f", copy lags {[round(x, 2) for x in result['copy_lag_s']]} s" if replicate else ""))
        off = statistics.fmean(float(x["mean_step_s"]) for x in runs[False])
        on = statistics.fmean(float(x["mean_step_s"]) for x in runs[True])
        lags = [lag for x in runs[True] for lag in x["copy_lag_s"]]  # type: ignore[attr-defined]
        print(f"step time: off {off * 1000:.1f} ms, on {on * 1000:.1f} ms: {100 * (on / off - 1):+.1f} %")
        if lags:
            print(f"checkpoint written -> copy whole on the other pod: median {statistics.median(lags):.2f} s, "
                  f"max {max(lags):.2f} s ({len(lags)} checkpoints of {args.size_mb} MB)")
        rest = restores(base / "restore", args.size_mb)
        print(f"restore of {args.size_mb} MB into a fresh pod: from a peer {rest['from_peer_s']:.2f} s "
              f"({args.size_mb / rest['from_peer_s']:.0f} MB/s), from the object store "
              f"{rest['from_object_store_s']:.2f} s ({args.size_mb / rest['from_object_store_s']:.0f} MB/s)")
    finally:
        shutil.rmtree(base, ignore_errors=True)
        print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()

"""Recovery benchmark (not a test): on a real node, inject N faults of each kind into a running 2-worker job, once
with ``spares: 0`` and once with ``spares: 1`` in the same run, and print p50/p95 of every recovery phase and of
the total, from the fault to the first training step after it.

    .venv/bin/python bench/recovery.py --faults 5 --out docs/bench      # a local cluster with one real node
    .venv/bin/python bench/recovery.py --kubeconfig KC                    # any cluster with the images

Kinds: ``kill -9`` (the trainer of a training pod: torchrun restarts the group in the pod), ``pod deleted`` (a
training pod, gracefully: a spare can take its place), ``rendezvous deleted`` (the store pod: the group trains
through and the agents reconnect to the new store; the total is then the first step rank 0 logs after the fault).
Each fault comes ``--spacing`` seconds after the job is quiet again (Running, incident recovered, spares back, a
newer checkpoint). Clock: the fault's own time (this process, milliseconds) to rank 0's start record
(``status.progress.start``: rendezvous, checkpointLoaded, firstStep, milliseconds); the pod phases
(replacementCreated, scheduled, containerStarted) come from the first pod created after the fault (Kubernetes
timestamps: 1 s resolution). The real node runs on this machine, so both clocks are the same clock.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import recovery_nodes  # noqa: E402
from tests.conftest import Cluster, wait_for  # noqa: E402
from tests.e2e import training as t  # noqa: E402

ts = recovery_nodes.ts

JOB = "bench"
WORKER_PHASES = ("rendezvous", "checkpointLoaded", "firstStep")
POD_PHASES = ("replacementCreated", "scheduled", "containerStarted")
KINDS = ("kill -9", "pod deleted", "rendezvous deleted")
TRAINER = ["python", "-m", "ddpjob_worker.examples.charlm", "--epochs", "1000", "--steps-per-epoch", "60",
           "--batch-size", "16", "--d-model", "64", "--checkpoint-every", "5", "--step-delay", "0.2", "--seed", "1",
           "--log-every", "1"]  # every step logged: the first step after a fault the group trains through


def status(cluster: Cluster, ns: str) -> dict[str, Any]:
    return t.job_status(cluster, ns, JOB)


def training_pods(cluster: Cluster, ns: str) -> list[str]:
    pods = [p["metadata"]["name"] for p in t.worker_pods(cluster, ns, JOB)
            if p["metadata"]["labels"].get("ddpjob.io/replica-type") == "worker"
            and p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
    return sorted(p for p in pods if t.has_trainer(cluster, ns, p))


def wait_quiet(cluster: Cluster, ns: str, spares: int, after_checkpoint: int) -> int:
    """Running, no incident recovering, every spare back, a checkpoint newer than the last fault's."""
    def quiet() -> int | None:
        s = status(cluster, ns)
        recent = s.get("incidents") or []
        step = int(((s.get("progress") or {}).get("lastCheckpoint") or {}).get("step") or 0)
        if s.get("state") == "Failed":
            raise SystemExit(f"the job failed: {json.dumps(s.get('conditions'))[-1500:]}")
        if s.get("state") != "Running" or (recent and recent[-1].get("outcome") != "Recovered"):
            return None
        if spares and s.get("spares") != f"{spares}/{spares}":
            return None
        return step if step > after_checkpoint else None
    found = wait_for(quiet, timeout=600, interval=0.5, describe="job quiet")
    assert isinstance(found, int)
    return found


def inject(cluster: Cluster, ns: str, kind: str) -> float:
    """Inject one fault; returns its time (taken right before the API call or exec that causes it)."""
    if kind == "rendezvous deleted":
        at = time.time()
        cluster.kubectl("delete", "pod", f"{JOB}-rdzv", "-n", ns, "--wait=false")
        return at
    victim = training_pods(cluster, ns)[-1]
    if kind == "kill -9":
        at = time.time()
        t.kill9_trainer(cluster, ns, victim)
        return at
    at = time.time()
    cluster.kubectl("delete", "pod", victim, "-n", ns, "--wait=false")
    return at


def pod_phases(cluster: Cluster, ns: str, at: float) -> dict[str, float]:
    """Pod phases of the first pod created at or after the fault (1 s timestamps, so compared at the second)."""
    new = [p for p in t.worker_pods(cluster, ns, JOB) if (ts(p["metadata"]["creationTimestamp"]) or 0) >= int(at)]
    if not new:
        return {}
    return recovery_nodes.pod_phases_of(min(new, key=lambda p: p["metadata"]["creationTimestamp"]), at)


def measure(cluster: Cluster, ns: str, kind: str, at: float) -> dict[str, Any]:
    """Wait for rank 0's start record of a group formed after the fault and its first step; the phases. A lost
    store that the group trained through forms no group: then its incident's end (the new store up) is awaited,
    and the total is the first step rank 0 logged after the fault (kubelet timestamps)."""
    def recovered() -> tuple[str, dict[str, Any]] | None:
        s = status(cluster, ns)
        start = (s.get("progress") or {}).get("start") or {}
        rdzv, first = ts(start.get("rendezvousTime")), ts(start.get("firstStepTime"))
        # The agent announces the rendezvous alone (the previous group's other times stay until rank 0's
        # first report): a group's record is complete once its first step is not older than it.
        if rdzv is not None and first is not None and first >= rdzv > at:
            return "regrouped", start
        last = (s.get("incidents") or [{}])[-1]
        began = ts(last.get("startTime"))
        if began is not None and began >= int(at) and last.get("outcome") == "Recovered":
            return "trained through", last
        return None
    found = wait_for(recovered, timeout=300, interval=0.25, describe=f"first step after {kind}")
    assert isinstance(found, tuple)
    how, record = found
    time.sleep(2)  # the replacement pod's container start lands a moment later; it is reported, not summed
    if how == "regrouped":
        phases = {p: (ts(record.get(f"{p}Time")) or at) - at for p in WORKER_PHASES}
    else:
        steps = [when for when, _ in t.RunLogs.collect(cluster, ns, JOB).steps(rank=0) if when > at]
        phases = {"firstStep": min(steps) - at} if steps else {}
    return {**phases, **pod_phases(cluster, ns, at), **({"trainedThrough": True} if how != "regrouped" else {})}


def run_case(cluster: Cluster, selector: dict[str, str], spares: int, faults: int, spacing: float,
             logs: Path | None = None) -> list[dict[str, Any]]:
    ns = f"bench-recovery-{spares}-{os.getpid()}"
    cluster.kubectl("create", "namespace", ns)
    manifest = t.ddpjob_manifest(JOB, ns, node_selector=selector, args=TRAINER, claim=False, spares=spares,
                                 run_policy={"backoffLimit": 1000})
    manifest["spec"]["maxRestarts"] = 1000  # every kill -9 is an in-pod restart, never a pod that gives up
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
    rows: list[dict[str, Any]] = []
    checkpoint = 0
    texts: dict[str, str] = {}

    def capture() -> None:  # a deleted pod's log goes with it: read every log around each fault
        nonlocal texts
        if logs is not None:
            texts = t.merge_logs(texts, t.capture_logs(cluster, ns, JOB))
    try:
        for i in range(faults * len(KINDS)):
            kind = KINDS[i % len(KINDS)]
            checkpoint = wait_quiet(cluster, ns, spares, checkpoint)
            time.sleep(spacing)  # faults are independent events, not a burst: see --spacing
            capture()
            at = inject(cluster, ns, kind)
            row = {"spares": spares, "kind": kind, "at": round(at, 3), **measure(cluster, ns, kind, at)}
            capture()
            rows.append(row)
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    finally:
        if logs is not None:
            logs.mkdir(parents=True, exist_ok=True)
            for pod, text in texts.items():
                (logs / f"spares-{spares}-{pod.replace('@', '-')}.log").write_text(text)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    return rows


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summary(rows: list[dict[str, Any]], kinds: tuple[str, ...] = KINDS,
            phases: tuple[str, ...] = (*POD_PHASES, *WORKER_PHASES)) -> list[str]:
    head = f"{'kind':<20} {'spares':>6} {'n':>3} | " + " | ".join(f"{p:>18}" for p in phases)
    out = [head, "p50 / p95 seconds from the fault; firstStep is the total", "-" * len(head)]
    spares_seen = sorted({r["spares"] for r in rows})
    for kind in [*kinds, "all faults"]:
        for spares in spares_seen:
            sel = [r for r in rows if r["kind"] in (kind, *([] if kind != "all faults" else kinds))
                   and r["spares"] == spares]
            if not sel:
                continue
            cells = []
            for p in phases:
                vals = [r[p] for r in sel if p in r and (kind != "all faults" or p == "firstStep")]
                cells.append(f"{pct(vals, 0.5):>7.2f} / {pct(vals, 0.95):>7.2f}" if vals else f"{'-':>18}")
            through = sum(bool(r.get("trainedThrough")) for r in sel)
            note = f"  ({through} trained through: no group restart)" if through else ""
            extra = sum(int(r.get("incidents", 1)) != 1 for r in sel)
            note += f"  ({extra} faults not counted as exactly one incident)" if extra else ""
            out.append(f"{kind:<20} {spares:>6} {len(sel):>3} | " + " | ".join(cells) + note)
    return out


def plot(rows: list[dict[str, Any]], path: Path, kinds: tuple[str, ...] = KINDS,
         phases: tuple[str, ...] = WORKER_PHASES, title: str = "real node") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.38
    colors = ["#c6dbef", "#9ecae1", "#4292c6", "#08519c"][-len(phases):]
    for s_i, spares in enumerate(sorted({r["spares"] for r in rows})):
        xs, bottoms = [], []
        for k_i, kind in enumerate(kinds):
            sel = [r for r in rows if r["kind"] == kind and r["spares"] == spares]
            xs.append(k_i + (s_i - 0.5) * width)
            # A phase that did not happen (a store lost and trained through: no new group) is drawn as 0 s.
            bottoms.append([statistics.median([r.get(p, 0.0) for r in sel]) if sel else 0.0 for p in phases])
        prev = [0.0] * len(xs)
        for p_i, phase in enumerate(phases):
            tops = [b[p_i] for b in bottoms]
            ax.bar(xs, [max(0.0, top - low) for top, low in zip(tops, prev, strict=True)], width, bottom=prev,
                   color=colors[p_i], edgecolor="white" if spares == 0 else "black",
                   hatch="" if spares == 0 else "//", label=f"{phase} (spares {spares})")
            prev = [max(top, low) for top, low in zip(tops, prev, strict=True)]
    ax.set_xticks(range(len(kinds)), list(kinds))
    ax.set_ylim(0, ax.get_ylim()[1] * 1.4)  # room for the legend above the bars
    ax.set_ylabel("seconds from the fault (median)")
    ax.set_title(f"Recovery per phase: spares 0 (plain) vs 1 (hatched), {title}")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def local_cluster(directory: Path) -> tuple[Cluster, Callable[[], None]]:
    from tests.cluster.controlplane import down, up

    state = up(directory, real_node=True, nodes=1)
    cluster = Cluster(state.kubeconfig)
    t.import_images(directory, t.NODE_IMAGES)
    t.helm_install_operator(cluster)
    return cluster, lambda: down(directory, quiet=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", choices=("pod", "node"), default="pod",
                        help="pod: kill -9, pod deleted, rendezvous deleted on one real node; node: a node powered "
                             "off or partitioned on the local multi-node cluster (bench/recovery_nodes.py)")
    parser.add_argument("--faults", type=int, default=5, help="faults of each kind per spares setting")
    parser.add_argument("--spares", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--spacing", type=float, default=15.0,
                        help="seconds between the job being quiet again and the next fault (faults are independent "
                             "events; 0 measures bursts, where the last recovery's pre-started trainer is not yet "
                             "replaced)")
    parser.add_argument("--kubeconfig", type=Path, help="an existing cluster with the images and the operator "
                        "(pod kinds only: the node kinds take down the local cluster's nodes)")
    parser.add_argument("--out", type=Path, help="write recovery[-node].json and recovery[-node].png here")
    parser.add_argument("--logs", type=Path, help="keep every worker pod's log (kubelet timestamps) here")
    args = parser.parse_args()
    if args.kinds == "node" and args.kubeconfig:
        parser.error("--kinds node runs on the local cluster's network-namespace nodes: leave out --kubeconfig")
    tmp = Path(tempfile.mkdtemp(prefix="ddpjob-recovery-", dir="/tmp"))
    start = recovery_nodes.local_cluster if args.kinds == "node" else local_cluster
    cluster, stop = (Cluster(args.kubeconfig), lambda: None) if args.kubeconfig else start(tmp / "c")
    load = os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    try:
        selector = {"ddpjob.io/real-node": "true"} if not args.kubeconfig else {}
        for spares in args.spares:
            if args.kinds == "node":
                rows += recovery_nodes.run_case(cluster, spares, args.faults, args.spacing, TRAINER)
            else:
                rows += run_case(cluster, selector, spares, args.faults, args.spacing, args.logs)
    finally:
        stop()
        shutil.rmtree(tmp, ignore_errors=True)  # the cluster's directory, empty of processes and mounts after down
    print(f"load average {load:.1f} before, {os.getloadavg()[0]:.1f} after, on {os.cpu_count()} CPUs")
    node = args.kinds == "node"
    kinds, phases = (recovery_nodes.KINDS, recovery_nodes.PHASES) if node else (KINDS, (*POD_PHASES, *WORKER_PHASES))
    print("\n".join(summary(rows, kinds, phases)))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        stem = "recovery-node" if node else "recovery"
        (args.out / f"{stem}.json").write_text(json.dumps(rows, indent=1))
        plot(rows, args.out / f"{stem}.png", kinds, recovery_nodes.PLOTTED if node else WORKER_PHASES,
             "a node lost (4 real nodes)" if node else "real node")
        print(f"wrote {args.out / stem}.json and .png")


if __name__ == "__main__":
    main()

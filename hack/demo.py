"""`make demo`: a real-node cluster, the operator installed with Helm, the CPU example DDPJob, followed live.

    .venv/bin/python hack/demo.py [--dir .cluster] [--manifest manifests/examples/cpu-charlm.yaml] [--down]

Reuses a live cluster in --dir (e.g. from `make cluster-up NODE=real`), else starts one. The live view shows the
job's state, ready workers, epoch/step/loss, the last checkpoint and incidents (status.progress is written by the
worker's rank 0), plus each pod's phase. The cluster stays up afterwards unless --down is given.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402
from rich.console import Console, Group  # noqa: E402
from rich.live import Live  # noqa: E402
from rich.table import Table  # noqa: E402

from tests.conftest import Cluster, _live  # noqa: E402
from tests.e2e import training as t  # noqa: E402

console = Console()


def ensure_cluster(directory: Path) -> Cluster:
    kubeconfig = directory / "kubeconfig"
    if kubeconfig.exists() and _live(kubeconfig) and (directory / "node" / "state.json").exists():
        console.print(f"[green]reusing the real-node cluster in {directory}")
        return Cluster(kubeconfig)
    from tests.cluster.controlplane import up

    console.print(f"starting the control plane and a real node in {directory} ...")
    # No Kueue or scheduler-plugins: the demo's job uses neither, and `make demo` builds neither (hack/demo.sh).
    return Cluster(up(directory, real_node=True, addons=False).kubeconfig)


def _incidents(status: dict[str, Any]) -> str:
    """The incident count and the latest incident (cause, outcome, recovery time)."""
    recent = status.get("incidents") or []
    if not recent:
        return str(status.get("incidentCount", 0))
    last = recent[-1]
    took = f" in {last['recoverySeconds']}s" if "recoverySeconds" in last else ""
    what = f"#{last.get('id')} {last.get('cause')}, {last.get('outcome')}{took}"
    return f"{status.get('incidentCount', 0)} (last: {what})"


def view(cluster: Cluster, ns: str, name: str, started: float) -> tuple[Group, str]:
    job = json.loads(cluster.kubectl("get", "ddpjob", name, "-n", ns, "-o", "json").stdout)
    status: dict[str, Any] = job.get("status") or {}
    progress: dict[str, Any] = status.get("progress") or {}
    state = status.get("state", "Pending")
    color = {"Succeeded": "green", "Failed": "red", "Restarting": "yellow"}.get(state, "cyan")
    head = Table.grid(padding=(0, 2))
    for key, value in [
        ("DDPJob", f"{ns}/{name}"), ("state", f"[{color}]{state}"),
        ("workers ready", status.get("ready", f"0/{job['spec']['replicas']}")),
        ("epoch / step", f"{progress.get('epoch', '-')} / {progress.get('step', '-')} "
                         f"(global {progress.get('globalStep', '-')})"),
        ("loss", str(progress.get("loss", "-"))),
        ("last checkpoint", str((progress.get("lastCheckpoint") or {}).get("step", "-"))),
        ("incidents", _incidents(status)),
        ("elapsed", f"{time.monotonic() - started:.0f}s"),
    ]:
        head.add_row(f"[bold]{key}", value)
    pods = Table("pod", "phase", "ready", "container restarts", title="pods", title_justify="left")
    items = json.loads(cluster.kubectl("get", "pods", "-n", ns, "-l", f"ddpjob.io/job-name={name}",
                                       "-o", "json").stdout)["items"]
    for pod in sorted(items, key=lambda p: p["metadata"]["name"]):
        cs = (pod["status"].get("containerStatuses") or [{}])[0]
        waiting = (cs.get("state") or {}).get("waiting", {}).get("reason")
        pods.add_row(pod["metadata"]["name"], waiting or pod["status"].get("phase", "?"),
                     "yes" if cs.get("ready") else "no", str(cs.get("restartCount", 0)))
    return Group(head, pods), state


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=REPO / ".cluster")
    parser.add_argument("--manifest", type=Path, default=REPO / "manifests" / "examples" / "cpu-charlm.yaml")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--down", action="store_true", help="tear the cluster down at the end")
    args = parser.parse_args()
    directory = args.dir.resolve()
    cluster = ensure_cluster(directory)
    rc = 1
    try:
        t.import_images(directory, t.NODE_IMAGES)
        t.helm_install_operator(cluster)
        job = yaml.safe_load(args.manifest.read_text())
        name = job["metadata"]["name"]
        cluster.kubectl("delete", "ddpjob", name, "-n", args.namespace, "--ignore-not-found", "--wait=true")
        cluster.kubectl("delete", "pvc", f"{name}-checkpoints", "-n", args.namespace, "--ignore-not-found")
        cluster.kubectl("apply", "-n", args.namespace, "-f", "-", stdin=json.dumps(job))
        started = time.monotonic()
        state = "Pending"
        with Live(console=console, refresh_per_second=2) as live:
            while time.monotonic() - started < args.timeout:
                try:
                    renderable, state = view(cluster, args.namespace, name, started)
                    live.update(renderable)
                except (AssertionError, json.JSONDecodeError, KeyError):
                    pass
                if state in ("Succeeded", "Failed"):
                    break
                time.sleep(1)
        color = "green" if state == "Succeeded" else "red"
        console.print(f"[{color}]DDPJob {name}: {state} after {time.monotonic() - started:.0f}s")
        rc = 0 if state == "Succeeded" else 1
        if rc:
            status = t.job_status(cluster, args.namespace, name)
            console.print(f"conditions: {json.dumps(status.get('conditions'), indent=1)[-2000:]}")
            console.print(f"incidents: {json.dumps(status.get('incidents'), indent=1)[-2000:]}")
    finally:
        if args.down:
            from tests.cluster.controlplane import down

            down(directory)
            console.print("cluster removed")
        else:
            console.print(f"the cluster stays up:\n  export KUBECONFIG={directory / 'kubeconfig'}\n"
                          f"  kubectl get ddpj -A\nremove it with: make cluster-down"
                          f"{'' if directory == (REPO / '.cluster').resolve() else f' CLUSTER_DIR={directory}'}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark (not a test): what Kueue costs a burst of jobs. N DDPJobs x W workers created at once against the local
control plane (the real Kueue manager, kwok nodes), first queued in a LocalQueue whose ClusterQueue has quota for
all of them, then the same jobs without the queue label, each case in a namespace of its own and with an operator
of its own. Reports seconds from the first create until every worker pod exists, and the ratio.

    .venv/bin/python bench/kueue_queue.py --jobs 100 --workers 4
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.operator_scale import PodCounter, api_client, delete_namespace, start_operator, wait_until  # noqa: E402
from tests.cluster.controlplane import down, up  # noqa: E402
from tests.integration.operator_support import small_job  # noqa: E402

V = "kueue.x-k8s.io/v1beta2"


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> None:
    proc = subprocess.run(["kubectl", f"--kubeconfig={kubeconfig}", *args], input=stdin, text=True,
                          capture_output=True)
    if proc.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {proc.stderr}")


def queues(kubeconfig: Path, ns: str) -> None:
    """Quota for every job of the case, in ``ns``'s LocalQueue ``q``."""
    objs = [{"apiVersion": V, "kind": "ResourceFlavor", "metadata": {"name": "bench"}},
            {"apiVersion": V, "kind": "ClusterQueue", "metadata": {"name": "bench"}, "spec": {
                "namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [
                    {"name": "bench", "resources": [{"name": "cpu", "nominalQuota": "10000"},
                                                    {"name": "memory", "nominalQuota": "100Ti"}]}]}]}},
            {"apiVersion": V, "kind": "LocalQueue", "metadata": {"name": "q", "namespace": ns},
             "spec": {"clusterQueue": "bench"}}]
    kubectl(kubeconfig, "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))


def case(kubeconfig: Path, n: int, workers: int, queued: bool, logdir: Path) -> dict[str, Any]:
    from kubernetes import client

    api = api_client(kubeconfig)
    core: Any = client.CoreV1Api(api)
    custom: Any = client.CustomObjectsApi(api)
    ns = f"bench-{'kueue' if queued else 'plain'}-{n}"
    core.create_namespace({"metadata": {"name": ns}})
    wait_until(lambda: core.list_namespaced_service_account(ns).items, 30, "default SA")
    if queued:
        queues(kubeconfig, ns)
    log = open(logdir / f"operator-{ns}.log", "wb")  # noqa: SIM115
    op = start_operator(kubeconfig, ns, log)
    try:
        counter = PodCounter(api, ns, "ddpjob.io/replica-type=worker", n * workers)
        time.sleep(3)  # kopf's initial listing before the clock starts
        jobs = []
        for i in range(n):
            body = small_job(f"job-{i}", workers, checkpoint={"volumeClaim": {"size": "1Gi"}})
            body["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m"}}
            if queued:
                body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "q"}
            jobs.append(body)
        t0 = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda b: custom.create_namespaced_custom_object("ddpjob.io", "v1alpha1", ns, "ddpjobs", b),
                          jobs))
        pods_s = counter.wait(1800) - t0
    finally:
        os.killpg(op.pid, signal.SIGTERM)
        op.wait(30)
        log.close()
    delete_namespace(kubeconfig, ns)
    return {"jobs": n, "workers": workers, "queued": queued, "all_pods_s": round(pods_s, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ddpjob-bench-kueue-"))
    state = up(work / "cluster")
    try:
        kubectl(state.kubeconfig, "apply", "-f", str(REPO / "operator" / "ddpjob_operator" / "crd" / "ddpjob-crd.yaml"))
        time.sleep(3)
        print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
        kueue = case(state.kubeconfig, args.jobs, args.workers, True, work)
        print(json.dumps(kueue), flush=True)
        plain = case(state.kubeconfig, args.jobs, args.workers, False, work)
        print(json.dumps(plain), flush=True)
    finally:
        down(work / "cluster", quiet=True)
    print(f"{args.jobs} jobs x {args.workers} workers, created -> every worker pod exists: with Kueue "
          f"{kueue['all_pods_s']:.1f} s, without {plain['all_pods_s']:.1f} s, ratio "
          f"{kueue['all_pods_s'] / max(plain['all_pods_s'], 1e-9):.2f}; load average at end "
          f"{os.getloadavg()[0]:.2f}; logs in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Gang scheduling benchmark (not a test): how long scheduler-plugins' coscheduling scheduler takes to place N gang
jobs x W workers, against kube-scheduler placing the same jobs without a gang, in one run on the local control plane
with kwok nodes (room for all of them: this measures scheduling work, not waiting for room).

Each job is what the operator creates for it (its own builders: W worker pods, the rendezvous pod and, for the
gang case, the PodGroup), created directly with a client so the operator's time is not in the number. The clock
runs from the first create to the last pod bound (spec.nodeName set). Rounds alternate the two cases.

    make bench-gang    # = .venv/bin/python bench/gang_scheduling.py --jobs 100 --workers 4 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ddpjob_operator.api.spec import parse_ddpjob  # noqa: E402
from ddpjob_operator.planner.children import builders, gang  # noqa: E402

from bench.operator_scale import api_client, wait_until  # noqa: E402
from tests.cluster.controlplane import down, up  # noqa: E402
from tests.integration.operator_support import small_job  # noqa: E402


def objects(ns: str, i: int, workers: int, with_gang: bool) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    spec: dict[str, Any] = {"scheduling": {"gang": {"scheduleTimeoutSeconds": 60}}} if with_gang else {}
    body = small_job(f"job-{i}", workers, **spec)
    body["metadata"].update(namespace=ns, uid=f"uid-{i}")
    body["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m", "memory": "128Mi"}}
    job = parse_ddpjob(body)
    pods = [builders.build_rendezvous_pod(job), *(builders.build_worker_pod(job, w) for w in range(workers))]
    group = gang.build_pod_group(job, pods[1], pods[0])
    for pod in pods:  # the per-job ServiceAccount is not created here; scheduling does not look at it
        pod["spec"].pop("serviceAccountName", None)
    return group, pods


def run_case(kubeconfig: Path, n: int, workers: int, with_gang: bool, round_: int) -> dict[str, Any]:
    from kubernetes import client

    api = api_client(kubeconfig)
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    ns = f"bench-{'gang' if with_gang else 'default'}-{round_}"
    core.create_namespace({"metadata": {"name": ns}})
    wait_until(lambda: core.list_namespaced_service_account(ns).items, 30, "default SA")
    jobs = [objects(ns, i, workers, with_gang) for i in range(n)]
    total = n * (workers + 1)

    def create(job: tuple[dict[str, Any] | None, list[dict[str, Any]]]) -> None:
        group, pods = job
        if group is not None:
            custom.create_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", ns, "podgroups", group)
        for pod in pods:
            core.create_namespaced_pod(ns, pod)

    def bound() -> int:
        items = json.loads(core.list_namespaced_pod(ns, _preload_content=False).data)["items"]
        return sum(bool(p["spec"].get("nodeName")) for p in items)

    t0 = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(create, jobs))
    created = time.monotonic() - t0
    wait_until(lambda: bound() == total, 900, f"{total} pods bound")
    took = time.monotonic() - t0
    subprocess.run(["kubectl", f"--kubeconfig={kubeconfig}", "delete", "namespace", ns, "--wait=true",
                    "--timeout=300s"], check=False, capture_output=True)
    case = "coscheduling (gang)" if with_gang else "kube-scheduler (no gang)"
    print(f"round {round_} {case}: {n} jobs x {workers} workers + rendezvous = {total} pods created in "
          f"{created:.1f}s, all bound after {took:.1f}s ({took - created:.1f}s after the last create)", flush=True)
    return {"case": case, "round": round_, "jobs": n, "pods": total, "created_s": created, "bound_s": took,
            "lag_s": took - created}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--kubeconfig", type=Path, help="an existing local cluster (default: start one, then stop it)")
    args = ap.parse_args()
    own = args.kubeconfig is None
    directory = Path(tempfile.mkdtemp(prefix="ddpjob-gang-bench-"))
    kubeconfig = up(directory).kubeconfig if own else args.kubeconfig
    try:
        results = []
        for r in range(args.rounds):
            order = (True, False) if r % 2 == 0 else (False, True)
            results += [run_case(kubeconfig, args.jobs, args.workers, g, r) for g in order]
    finally:
        if own:
            down(directory, quiet=True)
    for key, what in (("bound_s", "first create to all bound"), ("lag_s", "last create to all bound")):
        mean = {c: sum(r[key] for r in results if r["case"] == c) / args.rounds
                for c in ("coscheduling (gang)", "kube-scheduler (no gang)")}
        gang_s, plain_s = mean.values()
        print(f"mean over {args.rounds} round(s), {what}: coscheduling {gang_s:.1f}s, kube-scheduler "
              f"{plain_s:.1f}s, ratio {gang_s / plain_s:.2f}")


if __name__ == "__main__":
    main()

"""Scale benchmark (not a test): N DDPJobs x W workers submitted at once against the local control plane with
kwok nodes. Reports seconds until all worker pods exist and until all jobs are Running, API requests per job
(from the apiserver's audit log), operator CPU seconds and peak RSS, and the raw limit: a bare client creating
the same pods and Services directly. Writes a JSON result and a PNG plot.

    .venv/bin/python bench/operator_scale.py --jobs 1 100 500 --out docs/bench
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

from tests.cluster.controlplane import down, free_port, up  # noqa: E402
from tests.integration.operator_support import small_job  # noqa: E402

BENCH_UA = "ddpjob-bench"
OTHER_UAS = ("kube-controller-manager", "kube-scheduler", "kwok", "kubectl", BENCH_UA, "kube-apiserver")
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
"""


def api_client(kubeconfig: Path) -> Any:
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)  # type: ignore[no-untyped-call]
    cfg.connection_pool_maxsize = 32
    api = client.ApiClient(cfg)
    api.user_agent = BENCH_UA
    return api


def proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def count_pods(core: Any, ns: str, selector: str, phase: str | None = None) -> int:
    pods = core.list_namespaced_pod(ns, label_selector=selector, _preload_content=False)
    items = json.loads(pods.data)["items"]
    if phase:
        items = [p for p in items if p.get("status", {}).get("phase") == phase]
    return len(items)


def count_running_jobs(custom: Any, ns: str) -> int:
    jobs = custom.list_namespaced_custom_object("ddpjob.io", "v1alpha1", ns, "ddpjobs")["items"]
    return sum(any(c["type"] == "Running" and c["status"] == "True" for c in j.get("status", {}).get("conditions", []))
               for j in jobs)


def wait_until(check: Any, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.25)
    return time.monotonic()


def audit_count(audit_log: Path, namespace: str, since: float, until: float,
                by_call: dict[str, int] | None = None) -> dict[str, int]:
    """Requests per user agent in ``namespace`` (or cluster-scoped) between ``since`` and ``until``; ``by_call``,
    when given, also gets the operator's requests by verb and resource (where its requests per job go)."""
    by_ua: dict[str, int] = {}
    with audit_log.open() as fh:
        for line in fh:
            ev = json.loads(line)
            if ev.get("stage") != "ResponseComplete":
                continue
            ns = (ev.get("objectRef") or {}).get("namespace")
            if ns not in (namespace, None):
                continue
            ts = ev.get("stageTimestamp", "")
            t = time.mktime(time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
            if not since - 1 <= t <= until + 1:
                continue
            ua = ev.get("userAgent", "").split("/")[0]
            by_ua[ua] = by_ua.get(ua, 0) + 1
            if by_call is not None and not ua.startswith(OTHER_UAS):
                ref = ev.get("objectRef") or {}
                call = f"{ev.get('verb')} " + "/".join(filter(None, (ref.get("resource"), ref.get("subresource"))))
                by_call[call] = by_call.get(call, 0) + 1
    return by_ua


def delete_namespace(kubeconfig: Path, ns: str) -> None:
    """Delete a finished case's namespace and wait (bounded) so the next case starts on a quiet cluster."""
    subprocess.run(["kubectl", f"--kubeconfig={kubeconfig}", "delete", "namespace", ns, "--wait=true",
                    "--timeout=600s"], check=False, capture_output=True)


def run_operator_case(kubeconfig: Path, n: int, workers: int, logdir: Path, audit_log: Path) -> dict[str, Any]:
    from kubernetes import client

    api = api_client(kubeconfig)
    core: Any = client.CoreV1Api(api)
    custom: Any = client.CustomObjectsApi(api)
    ns = f"bench-op-{n}"
    core.create_namespace({"metadata": {"name": ns}})
    wait_until(lambda: core.list_namespaced_service_account(ns).items, 30, "default SA")
    log = open(logdir / f"operator-{n}.log", "wb")  # noqa: SIM115
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    op = subprocess.Popen([sys.executable, "-m", "ddpjob_operator.cli", "operator", "-n", ns,
                           "--metrics-port", str(free_port()), "--liveness-port", str(free_port())],
                          stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        time.sleep(3)  # let kopf finish its initial listing before the clock starts
        cpu0 = proc_cpu_seconds(op.pid)
        t0 = time.monotonic()
        wall0 = time.time()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: custom.create_namespaced_custom_object(
                "ddpjob.io", "v1alpha1", ns, "ddpjobs", small_job(f"job-{i}", workers)), range(n)))
        t_submitted = time.monotonic()
        sel = "ddpjob.io/replica-type=worker"
        t_pods = wait_until(lambda: count_pods(core, ns, sel) >= n * workers, 1800, "all worker pods")
        t_running = wait_until(lambda: count_running_jobs(custom, ns) >= n, 1800, "all jobs Running")
        wall1 = time.time()
        cpu = proc_cpu_seconds(op.pid) - cpu0
        rss = proc_peak_rss_mb(op.pid)
    finally:
        os.killpg(op.pid, signal.SIGTERM)
        op.wait(30)
        log.close()
    by_call: dict[str, int] = {}
    by_ua = audit_count(audit_log, ns, wall0, wall1, by_call)
    op_requests = sum(v for k, v in by_ua.items() if not k.startswith(OTHER_UAS))
    return {
        "jobs": n, "workers": workers, "submit_s": t_submitted - t0, "all_pods_s": t_pods - t0,
        "all_running_s": t_running - t0, "operator_cpu_s": cpu, "operator_peak_rss_mb": rss,
        "operator_requests": op_requests, "requests_per_job": op_requests / n, "requests_by_agent": by_ua,
        "operator_requests_by_call": dict(sorted(by_call.items(), key=lambda kv: -kv[1])),
    }


def raw_pod(name: str, job: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"bench/job": job}},
            "spec": {"hostname": name, "subdomain": job, "restartPolicy": "Never",
                     "containers": [{"name": "worker", "image": "ddpjob-worker:dev"}]}}


def run_raw_case(kubeconfig: Path, n: int, workers: int) -> dict[str, Any]:
    """The raw limit: the same children (workers + rendezvous pod + headless Service per job), created by a
    bare client with 16 threads and no logic at all."""
    from kubernetes import client

    api = api_client(kubeconfig)
    core: Any = client.CoreV1Api(api)
    ns = f"bench-raw-{n}"
    core.create_namespace({"metadata": {"name": ns}})
    wait_until(lambda: core.list_namespaced_service_account(ns).items, 30, "default SA")

    def create_job(i: int) -> None:
        job = f"job-{i}"
        core.create_namespaced_service(ns, {"metadata": {"name": job}, "spec": {
            "clusterIP": "None", "publishNotReadyAddresses": True, "selector": {"bench/job": job}}})
        core.create_namespaced_pod(ns, raw_pod(f"{job}-rdzv", job))
        for w in range(workers):
            core.create_namespaced_pod(ns, raw_pod(f"{job}-worker-{w}", job))

    t0 = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(create_job, range(n)))
    t_pods = time.monotonic()
    t_running = wait_until(lambda: count_pods(core, ns, "bench/job", "Running") >= n * (workers + 1), 1800,
                           "raw pods Running")
    return {"jobs": n, "all_pods_s": t_pods - t0, "all_running_s": t_running - t0}


def plot(results: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [r["operator"]["jobs"] for r in results]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(ns, [r["operator"]["all_pods_s"] for r in results], "o-", label="ddpjob: all worker pods exist")
    ax.plot(ns, [r["operator"]["all_running_s"] for r in results], "s-", label="ddpjob: all jobs Running")
    ax.plot(ns, [r["raw"]["all_pods_s"] for r in results], "o--", label="raw client: all pods created")
    ax.plot(ns, [r["raw"]["all_running_s"] for r in results], "s--", label="raw client: all pods Running")
    ax.set_xlabel("DDPJobs submitted at once (4 workers each)")
    ax.set_ylabel("seconds")
    ax.set_title("ddpjob operator vs a bare client, local control plane + kwok, 2 cores")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 100, 500])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "bench")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ddpjob-bench-"))
    policy = work / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    audit_log = work / "audit.log"
    os.environ["DDPJOB_APISERVER_EXTRA_ARGS"] = (
        f"--audit-policy-file={policy} --audit-log-path={audit_log} --audit-log-format=json --audit-log-maxage=1"
    )
    cluster_dir = work / "cluster"
    state = up(cluster_dir)
    results = []
    try:
        kubeconfig = state.kubeconfig
        crd = REPO / "operator" / "ddpjob_operator" / "crd" / "ddpjob-crd.yaml"
        subprocess.run(["kubectl", f"--kubeconfig={kubeconfig}", "apply", "-f", str(crd)], check=True,
                       capture_output=True)
        time.sleep(3)
        for n in args.jobs:
            print(f"--- {n} jobs x {args.workers} workers", flush=True)
            op = run_operator_case(kubeconfig, n, args.workers, work, audit_log)
            print(json.dumps(op), flush=True)
            delete_namespace(kubeconfig, f"bench-op-{n}")
            raw = run_raw_case(kubeconfig, n, args.workers)
            print(json.dumps(raw), flush=True)
            delete_namespace(kubeconfig, f"bench-raw-{n}")
            results.append({"operator": op, "raw": raw})
    finally:
        down(cluster_dir, quiet=True)
    print()
    print(f"{'jobs':>5} {'pods exist s':>13} {'raw create s':>13} {'ratio':>6} {'all Running s':>14} "
          f"{'raw Running s':>14} {'req/job':>8} {'op CPU s':>9} {'peak RSS MB':>12}")
    for r in results:
        o, w = r["operator"], r["raw"]
        print(f"{o['jobs']:>5} {o['all_pods_s']:>13.1f} {w['all_pods_s']:>13.1f} "
              f"{o['all_pods_s'] / max(w['all_pods_s'], 1e-9):>6.2f} {o['all_running_s']:>14.1f} "
              f"{w['all_running_s']:>14.1f} {o['requests_per_job']:>8.1f} {o['operator_cpu_s']:>9.1f} "
              f"{o['operator_peak_rss_mb']:>12.0f}")
    (args.out / "operator-scale.json").write_text(json.dumps(results, indent=2))
    plot(results, args.out / "operator-scale.png")
    print(f"\nwrote {args.out / 'operator-scale.json'} and {args.out / 'operator-scale.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

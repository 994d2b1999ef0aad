"""Scale benchmark (not a test): N DDPJobs x W workers submitted at once against the local control plane with
kwok nodes. Reports seconds until all worker pods exist and until all jobs are Running, API requests per job
(from the apiserver's audit log), operator CPU seconds and peak RSS, and the raw limit: a bare client creating
each job's children directly, either the operator's very Service and pods (``same``, built by its builders: the
ratio's baseline) or minimal pods with the same names (``stub``, the baseline until 2026-11-25). Writes a JSON
result and a PNG plot.

    .venv/bin/python bench/operator_scale.py --jobs 1 100 500 --out docs/bench
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.cluster import controlplane  # noqa: E402
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


#: A watch of pods that carries only their metadata (PartialObjectMetadata): what counting them needs.
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


class PodCounter:
    """Counts the pods matching a selector from a metadata-only watch, in a thread, and remembers when it first saw
    ``target`` of them. Until 2026-11-25 the operator case polled a full LIST of its pods every 0.25 s: at 500 jobs
    that is up to 2,500 pods (~25 MB of JSON) per poll, served by the API server whose time the case measures,
    while the bare client's time is when its own creates return and costs no poll at all."""

    def __init__(self, api: Any, ns: str, selector: str, target: int) -> None:
        self.seen: set[str] = set()
        self.reached = threading.Event()
        self.at = 0.0
        self._args = (api, ns, selector, target)
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        from kubernetes import client

        api, ns, selector, target = self._args
        core: Any = client.CoreV1Api(api)
        while not self.reached.is_set():  # a watch ends after the server's timeout: start it again (no RV: all)
            resp = core.list_namespaced_pod(ns, label_selector=selector, watch=True, _preload_content=False,
                                            _headers={"Accept": METADATA_ONLY})
            for line in resp:
                event = json.loads(line)
                if event.get("type") == "ADDED":
                    self.seen.add(event["object"]["metadata"]["name"])
                if len(self.seen) >= target and not self.reached.is_set():
                    self.at = time.monotonic()
                    self.reached.set()
                    return

    def wait(self, timeout: float) -> float:
        """The monotonic time at which all target pods existed."""
        if not self.reached.wait(timeout):
            raise TimeoutError(f"timed out after {timeout}s: {len(self.seen)} pods seen")
        return self.at


def list_jobs(custom: Any, ns: str, page: int = 500) -> list[dict[str, Any]]:
    """Every DDPJob of ``ns``, 500 a page: one unpaged LIST of 5,000 jobs (~25 MB) timed out (504) at the API server
    of this 2-core machine while their 45,000 pods started."""
    items: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        raw = custom.list_namespaced_custom_object("ddpjob.io", "v1alpha1", ns, "ddpjobs", limit=page,
                                                   _continue=token, _preload_content=False)
        body = json.loads(raw.data)
        items += body["items"]
        token = (body.get("metadata") or {}).get("continue")
        if not token:
            return items


def count_running_jobs(custom: Any, ns: str) -> int:
    """How many jobs say Running; -1 when the API server did not answer in time (asked again at the next poll)."""
    from kubernetes.client.exceptions import ApiException

    try:
        jobs = list_jobs(custom, ns)
    except ApiException as err:
        if err.status not in (429, 500, 503, 504):
            raise
        print(f"counting Running jobs: the API server answered {err.status}; asking again", flush=True)
        return -1
    return sum(any(c["type"] == "Running" and c["status"] == "True" for c in j.get("status", {}).get("conditions", []))
               for j in jobs)


def wait_until(check: Any, timeout: float, what: str, poll: float = 0.25) -> float:
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(poll)
    return time.monotonic()


def submit_jobs(custom: Any, ns: str, jobs: list[str], workers: int) -> None:
    """Create a small_job of ``workers`` per name, 16 at a time (as users submitting at once). Start-up is never
    judged: kwok runs no trainer, and 5,000 jobs x 8 took over 30 min (the default startupDeadlineSeconds) to be
    Running here, so the first jobs were stalled and restarted while the last ones started."""
    policy = {"runPolicy": {"startupDeadlineSeconds": 0}}
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda name: custom.create_namespaced_custom_object(
            "ddpjob.io", "v1alpha1", ns, "ddpjobs", small_job(name, workers, **policy)), jobs))


def audit_count(audit_log: Path, namespace: str, since: float, until: float,
                by_call: dict[str, int] | None = None) -> dict[str, int]:
    """Requests per user agent in ``namespace`` (or cluster-scoped) between ``since`` and ``until``; ``by_call``,
    when given, also gets the operator's requests by verb and resource (where its requests per job go). Read from
    the audit log and the files the API server rotated it into (every 100 MB: 2,000 jobs x 8 workers wrote more)."""
    by_ua: dict[str, int] = {}
    for path in sorted(audit_log.parent.glob(audit_log.stem + "*" + audit_log.suffix)):
        _count_file(path, namespace, since, until, by_ua, by_call)
    return by_ua


def _count_file(path: Path, namespace: str, since: float, until: float, by_ua: dict[str, int],
                by_call: dict[str, int] | None) -> None:
    with path.open() as fh:
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


def ensure_capacity(kubeconfig: Path, pods: int) -> None:
    """Enough kwok nodes for ``pods`` (the cluster starts with KWOK_NODES of NODE_CAPACITY pods each): 2,000 jobs x 8
    workers are 18,000 pods."""
    per_node = int(controlplane.NODE_CAPACITY["pods"])
    needed = -(-pods * 5 // 4 // per_node)  # a quarter spare: replacements and terminating pods
    for i in range(controlplane.KWOK_NODES, needed):
        subprocess.run(["kubectl", f"--kubeconfig={kubeconfig}", "apply", "-f", "-"],
                       input=controlplane._node_manifest(i), text=True, capture_output=True, check=True)


def delete_namespace(kubeconfig: Path, ns: str) -> None:
    """Delete a finished case's namespace and wait (bounded) so the next case starts on a quiet cluster."""
    subprocess.run(["kubectl", f"--kubeconfig={kubeconfig}", "delete", "namespace", ns, "--wait=true",
                    "--timeout=600s"], check=False, capture_output=True)


def start_operator(kubeconfig: Path, ns: str, log: Any) -> subprocess.Popen[bytes]:
    """`ddpjob operator` watching ``ns``, its output into ``log``, in a process group of its own."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    return subprocess.Popen([sys.executable, "-m", "ddpjob_operator.cli", "operator", "-n", ns,
                             "--metrics-port", str(free_port()), "--liveness-port", str(free_port())],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def start_profiler(pid: int, out: Path | None) -> subprocess.Popen[bytes] | None:
    """`py-spy record` of the operator (its folded stacks in ``out``) while a case runs; None without --profile."""
    if out is None:
        return None
    spy = shutil.which("py-spy")
    if spy is None:
        raise SystemExit("--profile needs py-spy on PATH (pip install py-spy)")
    return subprocess.Popen([spy, "record", "--pid", str(pid), "--format", "raw", "--rate", "50", "--nonblocking",
                             "--output", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_profiler(spy: subprocess.Popen[bytes] | None) -> None:
    if spy is not None:
        spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        spy.wait(60)


def run_operator_case(kubeconfig: Path, n: int, workers: int, logdir: Path, audit_log: Path,
                      profile: Path | None = None) -> dict[str, Any]:
    from kubernetes import client

    api = api_client(kubeconfig)
    core: Any = client.CoreV1Api(api)
    custom: Any = client.CustomObjectsApi(api)
    ns = f"bench-op-{n}"
    core.create_namespace({"metadata": {"name": ns}})
    wait_until(lambda: core.list_namespaced_service_account(ns).items, 30, "default SA")
    log = open(logdir / f"operator-{n}.log", "wb")  # noqa: SIM115
    op = start_operator(kubeconfig, ns, log)
    try:
        sel = "ddpjob.io/replica-type=worker"
        counter = PodCounter(api, ns, sel, n * workers)
        time.sleep(3)  # let kopf finish its initial listing before the clock starts
        spy = start_profiler(op.pid, profile)
        cpu0 = proc_cpu_seconds(op.pid)
        t0 = time.monotonic()
        wall0 = time.time()
        submit_jobs(custom, ns, [f"job-{i}" for i in range(n)], workers)
        t_submitted = time.monotonic()
        t_pods = counter.wait(1800)
        t_running = wait_until(lambda: count_running_jobs(custom, ns) >= n, 1800, "all jobs Running")
        wall1 = time.time()
        cpu = proc_cpu_seconds(op.pid) - cpu0
        rss = proc_peak_rss_mb(op.pid)
        stop_profiler(spy)
    finally:
        os.killpg(op.pid, signal.SIGTERM)
        op.wait(30)
        log.close()
    by_call: dict[str, int] = {}
    by_ua = audit_count(audit_log, ns, wall0, wall1, by_call)
    op_requests = sum(v for k, v in by_ua.items() if not k.startswith(OTHER_UAS))
    return {
        "jobs": n, "workers": workers, "submit_s": t_submitted - t0, "all_pods_s": t_pods - t0,
        "all_running_s": t_running - t0, "operator_cpu_s": cpu, "operator_cpu_ms_per_job": 1000 * cpu / n,
        "operator_peak_rss_mb": rss,
        "operator_requests": op_requests, "requests_per_job": op_requests / n, "requests_by_agent": by_ua,
        "operator_requests_by_call": dict(sorted(by_call.items(), key=lambda kv: -kv[1])),
    }


def raw_pod(name: str, job: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"bench/job": job}},
            "spec": {"hostname": name, "subdomain": job, "restartPolicy": "Never",
                     "containers": [{"name": "worker", "image": "ddpjob-worker:dev"}]}}


def stub_children(ns: str, job: str, workers: int) -> list[dict[str, Any]]:
    """The first baseline: a headless Service and minimal pods with the children's names (one container, no env,
    volumes, probes or security context)."""
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": job}, "spec": {
        "clusterIP": "None", "publishNotReadyAddresses": True, "selector": {"bench/job": job}}}
    pods = [raw_pod(f"{job}-rdzv", job), *(raw_pod(f"{job}-worker-{w}", job) for w in range(workers))]
    return [svc, *({"apiVersion": "v1", "kind": "Pod", **p} for p in pods)]


def same_children(ns: str, job: str, workers: int) -> list[dict[str, Any]]:
    """The operator's own Service and pods for the same DDPJob, built by its builders (no ownerReference: there is
    no DDPJob). Not the NetworkPolicy nor the status writes: those stay the operator's extra work."""
    from ddpjob_operator.api.spec import parse_ddpjob
    from ddpjob_operator.planner.children import builders

    body = small_job(job, workers)
    body["metadata"].update(namespace=ns, uid=f"bench-{job}")
    parsed = parse_ddpjob(body)
    return [builders.build_service(parsed), builders.build_rendezvous_pod(parsed),
            *(builders.build_worker_pod(parsed, w) for w in range(workers))]


BASELINES = {"same": same_children, "stub": stub_children}


def run_raw_case(kubeconfig: Path, n: int, workers: int, children: str) -> dict[str, Any]:
    """The raw limit: each job's children (``same``: the operator's own Service and pods; ``stub``: minimal ones)
    created by a bare client with 16 threads and no logic at all, one child after the other."""
    from ddpjob_operator.planner.children.builders import build_worker_identity
    from kubernetes import client

    api = api_client(kubeconfig)
    core: Any = client.CoreV1Api(api)
    ns = f"bench-raw-{children}-{n}"
    core.create_namespace({"metadata": {"name": ns}})
    wait_until(lambda: core.list_namespaced_service_account(ns).items, 30, "default SA")
    rbac: Any = client.RbacAuthorizationV1Api(api)
    sa, role, binding = build_worker_identity(ns)  # what the operator creates once per namespace: before the clock
    core.create_namespaced_service_account(ns, sa)
    rbac.create_namespaced_role(ns, role)
    rbac.create_namespaced_role_binding(ns, binding)
    objs = {i: BASELINES[children](ns, f"job-{i}", workers) for i in range(n)}  # built before the clock too

    def create_job(i: int) -> None:
        for obj in objs[i]:
            if obj["kind"] == "Service":
                core.create_namespaced_service(ns, obj)
            else:
                core.create_namespaced_pod(ns, obj)

    t0 = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(create_job, range(n)))
    t_pods = time.monotonic()
    pods = n * (workers + 1)
    selector = "bench/job" if children == "stub" else "ddpjob.io/job-name"
    t_running = wait_until(lambda: count_pods(core, ns, selector, "Running") >= pods, 1800, "raw pods Running")
    return {"jobs": n, "children": children, "all_pods_s": t_pods - t0, "all_running_s": t_running - t0}


def plot(results: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [r["operator"]["jobs"] for r in results]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(ns, [r["operator"]["all_pods_s"] for r in results], "o-", label="ddpjob: all worker pods exist")
    ax.plot(ns, [r["operator"]["all_running_s"] for r in results], "s-", label="ddpjob: all jobs Running")
    what = results[0]["raw"].get("children", "stub") if results else "stub"
    ax.plot(ns, [r["raw"]["all_pods_s"] for r in results], "o--", label=f"raw client ({what}): all pods created")
    ax.plot(ns, [r["raw"]["all_running_s"] for r in results], "s--", label=f"raw client ({what}): all pods Running")
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
    parser.add_argument("--baselines", nargs="+", choices=sorted(BASELINES), default=["same", "stub"],
                        help="bare-client baselines, each in its own namespace; the first is the ratio's")
    parser.add_argument("--profile", action="store_true",
                        help="py-spy record the operator in each case: <out>/operator-<N>.pyspy (folded stacks)")
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
        ensure_capacity(kubeconfig, max(args.jobs) * (args.workers + 1))
        for n in args.jobs:
            print(f"--- {n} jobs x {args.workers} workers", flush=True)
            op = run_operator_case(kubeconfig, n, args.workers, work, audit_log,
                                   args.out / f"operator-{n}.pyspy" if args.profile else None)
            print(json.dumps(op), flush=True)
            delete_namespace(kubeconfig, f"bench-op-{n}")
            case: dict[str, Any] = {"operator": op}
            for children in args.baselines:
                raw = run_raw_case(kubeconfig, n, args.workers, children)
                print(json.dumps(raw), flush=True)
                delete_namespace(kubeconfig, f"bench-raw-{children}-{n}")
                case["raw" if children == args.baselines[0] else f"raw_{children}"] = raw
            results.append(case)
    finally:
        down(cluster_dir, quiet=True)
    print()
    print(f"{'jobs':>5} {'pods exist s':>13} {'raw create s':>13} {'ratio':>6} {'all Running s':>14} "
          f"{'raw Running s':>14} {'req/job':>8} {'op CPU s':>9} {'CPU ms/job':>11} {'peak RSS MB':>12}")
    for r in results:
        o, w = r["operator"], r["raw"]
        print(f"{o['jobs']:>5} {o['all_pods_s']:>13.1f} {w['all_pods_s']:>13.1f} "
              f"{o['all_pods_s'] / max(w['all_pods_s'], 1e-9):>6.2f} {o['all_running_s']:>14.1f} "
              f"{w['all_running_s']:>14.1f} {o['requests_per_job']:>8.1f} {o['operator_cpu_s']:>9.1f} "
              f"{1000 * o['operator_cpu_s'] / o['jobs']:>11.1f} {o['operator_peak_rss_mb']:>12.0f}")
        for key, other in r.items():
            if key.startswith("raw_"):
                ratio = o["all_pods_s"] / max(other["all_pods_s"], 1e-9)
                print(f"      against the {other['children']} baseline: raw create {other['all_pods_s']:.1f} s, "
                      f"ratio {ratio:.2f}, raw Running {other['all_running_s']:.1f} s")
    (args.out / "operator-scale.json").write_text(json.dumps(results, indent=2))
    plot(results, args.out / "operator-scale.png")
    print(f"\nwrote {args.out / 'operator-scale.json'} and {args.out / 'operator-scale.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

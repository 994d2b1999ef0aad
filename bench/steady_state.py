"""Steady-state benchmark (not a test; issue 46): N running DDPJobs x W workers on kwok, each with a simulated rank 0
that reports progress exactly as the worker runtime does (ddpjob_worker.progress.ProgressReporter: its 10 s interval,
its payload, a forced report after each checkpoint, its standard-library client with the worker ServiceAccount's
token) for a window of minutes. The operator runs as a ServiceAccount (bound to cluster-admin here) under the
chart's own FlowSchemas, so API Priority and Fairness treats it as in a cluster (an admin certificate is exempt).

Measured over the window: the operator's CPU (cores) and RSS, the API server's and etcd's CPU, API requests/s by
client and by verb and resource (the audit log), bytes/s written to etcd's WAL, requests APF rejected per
FlowSchema, the DDPJob object's size (p50/max), and the seconds from a deleted worker pod to the operator's
replacement: with the first jobs alone, with all N idle (no progress) and while the progress load runs.

    PYTHONPATH=operator:worker .venv/bin/python bench/steady_state.py --jobs 1000 --workers 8 --minutes 10
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import operator_scale as scale
import steady_support
from steady_support import RssSampler, Snapshot, audit_calls, latency_summary

from tests.cluster import controlplane

REPO = scale.REPO
OPERATOR_NS, OPERATOR_SA, RELEASE = "ddpjob-system", "ddpjob-operator", "ddpjob-operator"
FLOW_SCHEMA = f"{OPERATOR_NS}-{RELEASE}"  # the chart's clusterName: <namespace>-<fullname>
STEP_SECONDS = 1.0  # each simulated rank 0 does a step a second and reports it (sent at most every 10 s)
CHECKPOINT_EVERY = 100  # steps; a forced report follows each checkpoint, as after Checkpointer.save
#: Rank 0s that start (a forced write each) per second, at most: 5,000 started within 10 s had 2,878 of their writes
#: refused by API Priority and Fairness (429) and the API server's /metrics unanswered for 10 s, which ended a run;
#: jobs that really start together come from a creation that takes minutes.
STARTS_PER_SECOND = 50.0


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    return subprocess.run(["kubectl", f"--kubeconfig={kubeconfig}", *args], input=stdin, capture_output=True,
                          text=True, check=True).stdout


def operator_kubeconfig(kubeconfig: Path, work: Path) -> Path:
    """A kubeconfig for the operator's ServiceAccount (a day's token) and the chart's FlowSchemas applied."""
    kubectl(kubeconfig, "create", "namespace", OPERATOR_NS)
    kubectl(kubeconfig, "-n", OPERATOR_NS, "create", "serviceaccount", OPERATOR_SA)
    kubectl(kubeconfig, "create", "clusterrolebinding", "bench-operator", "--clusterrole=cluster-admin",
            f"--serviceaccount={OPERATOR_NS}:{OPERATOR_SA}")
    helm = controlplane.tool("helm")
    rendered = subprocess.run([str(helm), "template", RELEASE, str(REPO / "charts" / "ddpjob-operator"),
                               "--namespace", OPERATOR_NS, "--kube-version=1.30.0", "--show-only",
                               "templates/flowcontrol.yaml"], capture_output=True, text=True, check=True).stdout
    kubectl(kubeconfig, "apply", "-f", "-", stdin=rendered)
    token = kubectl(kubeconfig, "-n", OPERATOR_NS, "create", "token", OPERATOR_SA, "--duration=24h").strip()
    text = kubeconfig.read_text()
    user = text[text.index("users:"):text.index("contexts:")]
    out = work / "operator.kubeconfig"
    out.write_text(text.replace(user, f"users:\n- name: admin\n  user:\n    token: {token}\n"))
    return out


class CountingApi:
    """The worker runtime's own client (InClusterApi), counting its patches, failures and their seconds."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.ok, self.failed = inner, 0, 0
        self.seconds: list[float] = []
        self.lock = threading.Lock()

    def patch_namespaced_custom_object_status(self, *args: Any, **kwargs: Any) -> None:
        t0 = time.monotonic()
        try:
            self.inner.patch_namespaced_custom_object_status(*args, **kwargs)
        except Exception:
            with self.lock:
                self.failed += 1
            raise
        with self.lock:
            self.ok += 1
            self.seconds.append(time.monotonic() - t0)


class RankZeros:
    """A ProgressReporter per job, as rank 0 of each runs it: announce_start, a report every step, a forced one
    after each checkpoint; each job starts at a random offset within the first interval, as jobs would."""

    def __init__(self, ns: str, jobs: list[str], api: CountingApi) -> None:
        from ddpjob_worker import contract
        from ddpjob_worker.progress import ProgressReporter

        self.api, self.stop = api, threading.Event()
        rdzv = str(time.time())
        self.reporters = [ProgressReporter(api=api, total_steps=100_000, environ={
            "RANK": "0", contract.DDPJOB_NAME: job, contract.DDPJOB_NAMESPACE: ns,
            contract.DDPJOB_REPORT_PROGRESS: "1", contract.DDPJOB_RENDEZVOUS_TIME: rdzv}) for job in jobs]
        rng = random.Random(46)
        self.spread = max(10.0, len(jobs) / STARTS_PER_SECOND)
        self.offsets = [rng.uniform(0, self.spread) for _ in jobs]
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0, started, step = time.monotonic(), [False] * len(self.reporters), 0
        while not self.stop.is_set():
            step += 1
            for i, rep in enumerate(self.reporters):
                elapsed = time.monotonic() - t0
                if elapsed < self.offsets[i]:
                    continue
                if not started[i]:
                    started[i] = True
                    rep.announce_start()
                s = int(elapsed - self.offsets[i]) + 1
                saved = s // CHECKPOINT_EVERY * CHECKPOINT_EVERY or None
                rep.report(epoch=s // 1000, step=s % 1000, global_step=s, loss=2.0 / s, checkpoint_step=saved,
                           checkpoint_seconds=1.5 if saved else None, force=bool(saved) and s % CHECKPOINT_EVERY == 0)
            self.stop.wait(max(0.0, t0 + step * STEP_SECONDS - time.monotonic()))


def replace_once(core: Any, ns: str, job: str, index: int = 1) -> float:
    """Delete one worker pod (grace 0, as a lost node's force-delete) and time until the operator created its
    replacement (a pod of the same index with another UID)."""
    from ddpjob_operator.api import names

    sel = f"{names.LABEL_JOB_NAME}={job},{names.LABEL_REPLICA_INDEX}={index}"

    def pods() -> list[dict[str, Any]]:
        out = core.list_namespaced_pod(ns, label_selector=sel, _preload_content=False)
        return [p for p in json.loads(out.data)["items"] if p["metadata"]["labels"].get(
            names.LABEL_REPLICA_TYPE) == names.TYPE_WORKER]

    old = {p["metadata"]["uid"] for p in pods()}
    t0 = time.monotonic()
    core.delete_namespaced_pod(names.worker_pod_name(job, index), ns, grace_period_seconds=0)
    while time.monotonic() - t0 < 300:
        if any(p["metadata"]["uid"] not in old and not p["metadata"].get("deletionTimestamp") for p in pods()):
            return time.monotonic() - t0
        time.sleep(0.05)
    raise TimeoutError(f"no replacement for {job} worker {index} in 300 s")


def running(custom: Any, ns: str, n: int) -> None:
    """Wait for ``n`` Running jobs, listing them every 3 s per 1,000 (a LIST of 1,000 jobs is ~5 MB)."""
    scale.wait_until(lambda: scale.count_running_jobs(custom, ns) >= n, 3600, f"{n} jobs Running",
                     poll=3 * max(1, n // 1000))


def job_stats(custom: Any, ns: str) -> dict[str, Any]:
    """The DDPJob objects' sizes (bytes of JSON, as stored) and their incidents."""
    items = scale.list_jobs(custom, ns)
    sizes = sorted(len(json.dumps(i, separators=(",", ":"))) for i in items)
    reasons: dict[str, int] = {}
    for item in items:
        for inc in (item.get("status") or {}).get("incidents") or []:
            reasons[str(inc.get("cause"))] = reasons.get(str(inc.get("cause")), 0) + 1
    return {"jobs": len(items), "object_bytes_p50": statistics.median(sizes), "object_bytes_max": sizes[-1],
            "incidents_by_reason": reasons}


def worker_api(kubeconfig: Path, state: Any, ns: str, work: Path) -> CountingApi:
    """The worker runtime's InClusterApi with the namespace's worker ServiceAccount token, as a pod mounts it."""
    from ddpjob_operator.api import names
    from ddpjob_worker.statusclient import InClusterApi

    token = work / "worker-token"
    token.write_text(kubectl(kubeconfig, "-n", ns, "create", "token", names.WORKER_SERVICE_ACCOUNT,
                             "--duration=24h"))
    ca = Path(state.dir) / "pki" / "ca.crt"
    return CountingApi(InClusterApi("127.0.0.1", state.ports["apiserver"], token, ca))


def measure_window(ctx: dict[str, Any], minutes: float, samples: list[str]) -> dict[str, Any]:
    """The progress load for ``minutes``: counters before and after, RSS every 5 s, and a deleted worker pod of
    each job in ``samples`` at even spacing, timed to its replacement."""
    state, op, core, ns = ctx["state"], ctx["op"], ctx["core"], ctx["ns"]
    api = worker_api(ctx["kubeconfig"], state, ns, ctx["work"])
    writers = RankZeros(ns, ctx["jobs"], api)
    writers.thread.start()
    time.sleep(writers.spread + 10)  # every rank 0 started and sent its first reports
    spy = scale.start_profiler(op.pid, ctx["profile"] / "operator-loaded.pyspy" if ctx["profile"] else None)
    rss, before = RssSampler(op.pid), Snapshot(state, op.pid, FLOW_SCHEMA)
    end = before.t + 60 * minutes
    latencies, failures = [], []
    for i, job in enumerate(samples):
        time.sleep(max(0.0, before.t + (i + 1) * 60 * minutes / (len(samples) + 1) - time.monotonic()))
        try:
            latencies.append(replace_once(core, ns, job))
        except Exception as err:  # the API server did not answer (a 504 under load): a finding, not the end
            failures.append(f"{job}: {str(err).splitlines()[0]}")
    time.sleep(max(0.0, end - time.monotonic()))
    after = Snapshot(state, op.pid, FLOW_SCHEMA)
    writers.stop.set()
    scale.stop_profiler(spy)
    out = after.since(before)
    out.update(operator_rss=rss.summary(), replacement=latency_summary(latencies), replacement_failures=failures,
               audit=audit_calls(ctx["audit_log"], before.wall, after.wall))
    with api.lock:
        patch_s = sorted(api.seconds)
        out["progress_patches"] = {"ok": api.ok, "failed": api.failed,
                                   "p50_s": statistics.median(patch_s) if patch_s else None,
                                   "p95_s": patch_s[int(0.95 * len(patch_s))] if patch_s else None}
    return out


def idle_window(ctx: dict[str, Any], seconds: float, samples: list[str]) -> dict[str, Any]:
    """All jobs Running and nobody reporting: the operator's own steady cost, and replacements without load."""
    state, op = ctx["state"], ctx["op"]
    spy = scale.start_profiler(op.pid, ctx["profile"] / "operator-idle.pyspy" if ctx["profile"] else None)
    before = Snapshot(state, op.pid, FLOW_SCHEMA)
    latencies = [replace_once(ctx["core"], ctx["ns"], job) for job in samples]
    time.sleep(max(0.0, before.t + seconds - time.monotonic()))
    out = Snapshot(state, op.pid, FLOW_SCHEMA).since(before)
    scale.stop_profiler(spy)
    out["replacement"] = latency_summary(latencies)
    return out


def run(ctx: dict[str, Any], n: int, workers: int, minutes: float) -> dict[str, Any]:
    from kubernetes import client

    custom: Any = client.CustomObjectsApi(ctx["admin"])
    jobs = [f"job-{i}" for i in range(n)]
    ctx["jobs"] = jobs
    first = jobs[:5]
    scale.submit_jobs(custom, ctx["ns"], first, workers)
    running(custom, ctx["ns"], len(first))
    time.sleep(5)
    alone = latency_summary([replace_once(ctx["core"], ctx["ns"], j) for j in first])
    print(f"alone: replacement p50 {alone['p50_s']:.2f} s", flush=True)
    t0 = time.monotonic()
    scale.submit_jobs(custom, ctx["ns"], jobs[5:], workers)
    running(custom, ctx["ns"], n)
    created = time.monotonic() - t0
    print(f"{n} jobs Running in {created:.0f} s", flush=True)
    # What a run that breaks later still leaves: written after each phase (a 5,000-job run takes an hour).
    result: dict[str, Any] = {
        "jobs": n, "workers": workers, "minutes": minutes, "create_all_running_s": created,
        "report_budget": os.environ.get("DDPJOB_REPORT_WRITES_PER_SECOND", "default"),
        "replacement_alone": alone, "creation_operator": {"cpu_s": scale.proc_cpu_seconds(ctx["op"].pid),
                                                          "peak_hwm_mb": scale.proc_peak_rss_mb(ctx["op"].pid)}}
    ctx["partial"].write_text(json.dumps(result, indent=2))
    time.sleep(30)  # the creation's tail (status writes, the scheduler's binds) is over
    result["idle"] = idle_window(ctx, 120, jobs[5:15])
    print(f"idle: {json.dumps(result['idle'])}", flush=True)
    ctx["partial"].write_text(json.dumps(result, indent=2))
    result["loaded"] = measure_window(ctx, minutes, jobs[15:25])
    ctx["partial"].write_text(json.dumps(result, indent=2))
    result.update(objects=job_stats(custom, ctx["ns"]), load_1m_at_end=os.getloadavg()[0])
    return result


def report(r: dict[str, Any]) -> None:
    lo, idle = r["loaded"], r["idle"]
    n, secs = r["jobs"], lo["seconds"]
    by_agent: dict[str, int] = {}
    for key, count in lo["audit"].items():
        by_agent[key.split(" ")[0]] = by_agent.get(key.split(" ")[0], 0) + count
    print(f"\n{n} running jobs x {r['workers']} workers, progress for {secs / 60:.1f} min "
          f"(load {r['load_1m_at_end']:.1f} at the end)")
    for who, cores in lo["cpu_cores"].items():
        print(f"  CPU {who:<28} {cores:6.3f} cores loaded   {idle['cpu_cores'][who]:6.3f} idle")
    rss = lo["operator_rss"]
    print(f"  operator RSS avg {rss['avg_mb']:.0f} MB, max {rss['max_mb']:.0f} MB")
    for agent, count in sorted(by_agent.items(), key=lambda kv: -kv[1])[:6]:
        print(f"  requests {agent:<34} {count / secs:7.2f}/s  {count / secs / n * 60:6.2f}/job/min")
    print(f"  etcd WAL {lo['etcd_wal_bytes_per_s'] / 1024:.0f} KiB/s, {lo['etcd_puts_per_s']:.0f} puts/s; "
          f"APF {json.dumps(lo['apf'])}")
    print(f"  DDPJob object {r['objects']['object_bytes_p50']} B p50, {r['objects']['object_bytes_max']} B max; "
          f"incidents {r['objects']['incidents_by_reason']}")
    print(f"  progress patches {json.dumps(lo['progress_patches'])}")
    for what, rep in (("alone", r["replacement_alone"]), ("idle", idle["replacement"]),
                      ("loaded", lo["replacement"])):
        print(f"  replacement {what:<7} p50 {rep['p50_s']:.2f} s  p95 {rep['p95_s']:.2f} s  (n={rep['n']})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--profile", action="store_true",
                        help="py-spy record the operator in each window: <out>/operator-{idle,loaded}.pyspy")
    parser.add_argument("--report-budget", type=float, default=None,
                        help="the operator's --report-writes-per-second (default: its own, the chart's 50)")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "bench")
    parser.add_argument("--plot", nargs="+", metavar="LABEL=JSON",
                        help="only draw <out>/steady-state.png from earlier results, one bar group per run")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.plot:
        runs = [(label, json.loads(Path(path).read_text())) for label, path in (a.split("=", 1) for a in args.plot)]
        steady_support.plot(runs, args.out / "steady-state.png")
        return 0
    if args.report_budget is not None:
        os.environ["DDPJOB_REPORT_WRITES_PER_SECOND"] = str(args.report_budget)
    work = Path(tempfile.mkdtemp(prefix="ddpjob-steady-"))
    (work / "audit-policy.yaml").write_text(scale.AUDIT_POLICY)
    audit_log = work / "audit.log"
    os.environ["DDPJOB_APISERVER_EXTRA_ARGS"] = (
        f"--audit-policy-file={work / 'audit-policy.yaml'} --audit-log-path={audit_log} --audit-log-format=json "
        "--audit-log-maxage=1")
    state = controlplane.up(work / "cluster")
    ns, op = "bench-steady", None
    try:
        kubeconfig = state.kubeconfig
        kubectl(kubeconfig, "apply", "-f", str(REPO / "operator" / "ddpjob_operator" / "crd" / "ddpjob-crd.yaml"))
        scale.ensure_capacity(kubeconfig, args.jobs * (args.workers + 1))
        op_config = operator_kubeconfig(kubeconfig, work)
        kubectl(kubeconfig, "create", "namespace", ns)
        admin = scale.api_client(kubeconfig)
        from kubernetes import client

        core: Any = client.CoreV1Api(admin)
        scale.wait_until(lambda: core.list_namespaced_service_account(ns).items, 30, "default SA")
        log = open(work / "operator.log", "wb")  # noqa: SIM115
        op = scale.start_operator(op_config, ns, log)
        ctx = {"state": state, "op": op, "core": core, "admin": admin, "ns": ns, "kubeconfig": kubeconfig,
               "work": work, "audit_log": audit_log, "profile": args.out if args.profile else None,
               "partial": args.out / f"steady-state-{args.jobs}.partial.json"}
        result = run(ctx, args.jobs, args.workers, args.minutes)
    finally:
        if op is not None:
            os.killpg(op.pid, 15)
            op.wait(30)
        controlplane.down(work / "cluster", quiet=True)
    out = args.out / f"steady-state-{args.jobs}.json"
    out.write_text(json.dumps(result, indent=2))
    report(result)
    print(f"\nwrote {out}; operator log {work / 'operator.log'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

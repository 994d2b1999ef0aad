"""Measurements of bench/steady_state.py (issue 46): counters at an instant (CPU of the operator, the API server,
etcd and the bench; etcd's WAL bytes; API Priority and Fairness per FlowSchema), the operator's RSS over a window,
the audit log's requests by client and call, and latency summaries."""

from __future__ import annotations

import json
import resource
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import operator_scale as scale


def latency_summary(samples: list[float]) -> dict[str, Any]:
    s = sorted(samples) or [float("nan")]
    return {"n": len(s), "p50_s": statistics.median(s), "p95_s": s[min(len(s) - 1, int(0.95 * len(s)))],
            "max_s": s[-1], "samples_s": [round(x, 3) for x in samples]}


def scrape(url: str, pki: Path | None = None) -> dict[str, float]:
    """Prometheus text: sample name with labels -> value (the API server's with the admin certificate in ``pki``)."""
    import ssl
    import urllib.request

    tls = None
    if pki is not None:
        tls = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        tls.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    text = urllib.request.urlopen(url, timeout=60, context=tls).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                continue
    return out


def metric_sum(samples: dict[str, float], name: str, **labels: str) -> float:
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(v for k, v in samples.items()
               if (k == name or k.startswith(name + "{")) and all(w in k for w in want))


def audit_calls(audit_log: Path, since: float, until: float) -> dict[str, int]:
    """Requests between ``since`` and ``until`` (wall clock) by "<agent> <verb> <resource>", every namespace, from
    the audit log and the files the API server rotated it into (every 100 MB: ~10 min of 1,000 jobs' reports)."""
    out: dict[str, int] = {}
    for path in sorted(audit_log.parent.glob(audit_log.stem + "*" + audit_log.suffix)):
        _count_calls(path, since, until, out)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _count_calls(path: Path, since: float, until: float, out: dict[str, int]) -> None:
    with path.open() as fh:
        for line in fh:
            ev = json.loads(line)
            if ev.get("stage") != "ResponseComplete":
                continue
            ts = ev.get("stageTimestamp", "")
            t = time.mktime(time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
            if not since <= t < until:
                continue
            ref = ev.get("objectRef") or {}
            what = "/".join(filter(None, (ref.get("resource"), ref.get("subresource")))) or ev.get("requestURI", "")
            key = f"{ev.get('userAgent', '').split('/')[0]} {ev.get('verb')} {what}"
            out[key] = out.get(key, 0) + 1


class Snapshot:
    """Counters at one instant: CPU seconds of the operator, API server, etcd and this process; etcd's WAL bytes;
    APF's rejected and dispatched requests of the chart's two FlowSchemas."""

    def __init__(self, state: Any, op_pid: int, flow_schema: str) -> None:
        self.t, self.wall = time.monotonic(), time.time()
        self.cpu = {"operator": scale.proc_cpu_seconds(op_pid),
                    "apiserver": scale.proc_cpu_seconds(state.pids["kube-apiserver"]),
                    "etcd": scale.proc_cpu_seconds(state.pids["etcd"])}
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self.cpu["bench (simulated workers)"] = usage.ru_utime + usage.ru_stime
        etcd = scrape(f"http://127.0.0.1:{state.ports['etcd']}/metrics")
        self.wal_bytes = metric_sum(etcd, "etcd_disk_wal_write_bytes_total")
        self.puts = metric_sum(etcd, "etcd_mvcc_put_total")
        apf = scrape(f"https://127.0.0.1:{state.ports['apiserver']}/metrics", Path(state.dir) / "pki")
        self.apf = {f"{what} {fs}": metric_sum(apf, f"apiserver_flowcontrol_{what}_requests_total", flow_schema=fs)
                    for what in ("rejected", "dispatched") for fs in (flow_schema, f"{flow_schema}-progress")}

    def since(self, before: Snapshot) -> dict[str, Any]:
        dt = self.t - before.t
        return {"seconds": dt, "wall": [before.wall, self.wall],
                "cpu_cores": {k: (v - before.cpu[k]) / dt for k, v in self.cpu.items()},
                "etcd_wal_bytes_per_s": (self.wal_bytes - before.wal_bytes) / dt,
                "etcd_puts_per_s": (self.puts - before.puts) / dt,
                "apf": {k: v - before.apf[k] for k, v in self.apf.items()}}


class RssSampler:
    """The operator's resident memory every 5 s (average and peak over the window)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.stop = pid, threading.Event()
        self.samples: list[float] = []
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self.stop.wait(5) and Path(f"/proc/{self.pid}").exists():
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    self.samples.append(int(line.split()[1]) / 1024)

    def summary(self) -> dict[str, float]:
        self.stop.set()
        return {"avg_mb": statistics.fmean(self.samples), "max_mb": max(self.samples),
                "peak_hwm_mb": scale.proc_peak_rss_mb(self.pid)}


def plot(runs: list[tuple[str, dict[str, Any]]], out: Path) -> None:
    """Each run's operator and API server CPU (idle, loaded), its routine writes/s and its replacement seconds
    (p50 alone, idle, loaded) side by side: what each change bought."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (cpu, writes, repl) = plt.subplots(1, 3, figsize=(13, 4.2))
    x = range(len(runs))
    width = 0.2
    for i, (who, phase) in enumerate([("operator", "idle"), ("operator", "loaded"), ("apiserver", "idle"),
                                      ("apiserver", "loaded")]):
        cpu.bar([p + (i - 1.5) * width for p in x], [r[phase]["cpu_cores"][who] for _, r in runs], width,
                label=f"{who}, {phase}")
    cpu.axhline(0.1, color="grey", linestyle=":", label="operator bound 0.1")
    cpu.set_ylabel("cores (2-core machine)")
    cpu.set_title("CPU")
    writes.bar(list(x), [r["loaded"]["apf"][f"dispatched {FLOW}-progress"] / r["loaded"]["seconds"] for _, r in runs])
    writes.set_ylabel("worker progress writes / s")
    writes.set_title("progress writes (APF dispatched)")
    for i, phase in enumerate(("alone", "idle", "loaded")):
        repl.bar([p + (i - 1) * 0.25 for p in x], [_replacement(r, phase)["p50_s"] for _, r in runs], 0.25,
                 label=f"p50, {phase}")
    repl.set_yscale("log")
    repl.set_ylabel("seconds, deleted pod to its replacement")
    repl.set_title("replacement")
    for ax in (cpu, writes, repl):
        ax.set_xticks(list(x), [label for label, _ in runs], fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    cpu.legend(fontsize=7)
    repl.legend(fontsize=7)
    fig.suptitle(f"{runs[0][1]['jobs']} running DDPJobs x {runs[0][1]['workers']} workers on kwok, 10 min of progress")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


#: The chart's FlowSchema for the operator in bench/steady_state.py's install (release and namespace).
FLOW = "ddpjob-system-ddpjob-operator"


def _replacement(run: dict[str, Any], phase: str) -> dict[str, Any]:
    return dict(run["replacement_alone"] if phase == "alone" else run[phase]["replacement"])

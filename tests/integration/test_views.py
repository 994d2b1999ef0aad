"""`kubectl ddpjob describe` and `kubectl ddpjob list` against a real control plane: a job through two faults (a
worker that fails, a deleted pod), run the way a user runs them (kubectl finds the plugin on the PATH). kwok runs
no trainers, so the test writes status.progress as rank 0's reporter does (a merge patch of the status)."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cluster, wait_for
from tests.integration.operator_support import REPO, Jobs, OperatorProcess, small_job

NAME = "views"


@pytest.fixture
def prometheus(operator: OperatorProcess, tmp_path: Path) -> Iterator[str]:
    """A real Prometheus (built from its Go module, like promtool) scraping the operator every second; its URL."""
    from tests.cluster.controlplane import free_port, tool

    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({"global": {"scrape_interval": "1s"}, "scrape_configs": [{
        "job_name": "ddpjob-operator", "static_configs": [{"targets": [f"127.0.0.1:{operator.metrics_port}"]}]}]}))
    url = f"http://127.0.0.1:{free_port()}"
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen([str(tool("prometheus")), f"--config.file={config}", f"--storage.tsdb.path={tmp_path}/tsdb",
                             f"--web.listen-address={url.removeprefix('http://')}"], stdout=log, stderr=log)
    try:
        # Its first scrape comes a few seconds after it is ready (target discovery runs every 5 s).
        wait_for(lambda: instant(url, "up == 1")["data"]["result"], timeout=60,
                 describe="Prometheus scraping the operator",
                 state=lambda: (tmp_path / "prometheus.log").read_text()[-2000:])
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def _ms(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def report(cluster: Cluster, ns: str, step: int, *, group_started: datetime | None = None,
           checkpoint: int | None = None) -> None:
    """What rank 0's ProgressReporter patches: the step (of 100), the rate, the last checkpoint, and with
    ``group_started`` a new process group's start record (rendezvous, checkpoint loaded, first step)."""
    now = datetime.now(UTC)
    progress: dict[str, Any] = {"globalStep": step, "totalSteps": 100, "epoch": 0, "stepRate": 2.0,
                                "source": "Reporter", "lastStepTime": _ms(now), "updateTime": _ms(now)}
    if checkpoint is not None:
        progress["lastCheckpoint"] = {"step": checkpoint, "time": _ms(now), "seconds": 0.75}
    if group_started is not None:
        progress["start"] = {"rendezvousTime": _ms(group_started),
                             "checkpointLoadedTime": _ms(group_started + timedelta(milliseconds=300)),
                             "checkpointLoadSeconds": 0.25,
                             "firstStepTime": _ms(group_started + timedelta(milliseconds=500))}
    cluster.kubectl("patch", "ddpjob", NAME, "-n", ns, "--subresource=status", "--type=merge",
                    "-p", json.dumps({"status": {"progress": progress}}))


def recover(cluster: Cluster, jobs: Jobs, ns: str, incident: int, step: int) -> None:
    """The replacement runs; its group starts and steps: the incident is Recovered."""
    wait_for(lambda: jobs.get(NAME)["status"].get("incidentCount") == incident, timeout=30,
             describe=f"incident {incident}", state=lambda: jobs.describe(NAME))
    jobs.running(NAME, 2, timeout=90)
    report(cluster, ns, step, group_started=datetime.now(UTC), checkpoint=step - step % 10)

    def recovered() -> bool:
        incidents = jobs.get(NAME)["status"].get("incidents") or []
        return len(incidents) == incident and incidents[-1].get("outcome") == "Recovered"

    wait_for(recovered, timeout=30, describe=f"incident {incident} recovered", state=lambda: jobs.describe(NAME))


def test_describe_and_list_through_faults(cluster: Cluster, namespace: str, operator: OperatorProcess,
                                          jobs: Jobs, tmp_path: Path, prometheus: str) -> None:
    jobs.apply(small_job(NAME, 2, runPolicy={"backoffLimit": 5}))
    jobs.running(NAME, 2)
    jobs.wait_condition(NAME, "Running")
    report(cluster, namespace, 40, group_started=datetime.now(UTC) - timedelta(seconds=20), checkpoint=30)
    scraped(prometheus, namespace, 40)

    listed = cluster.ddpjob("list", "-n", namespace).stdout.splitlines()
    assert listed[0].split()[:5] == ["NAME", "STATE", "READY", "PROGRESS", "INCIDENTS"], listed
    assert listed[1].split()[:7] == [NAME, "Running", "2/2", "40/100", "(40%)", "0", "0.0s"], listed
    text = cluster.ddpjob("describe", NAME, "-n", namespace).stdout
    assert "Progress:    [########------------]   40%  step 40/100  epoch 0  2.00 steps/s  ETA 30s" in text, text
    assert "Checkpoint:  step 30, " in text and "Incidents:   0 of backoffLimit 5" in text, text

    jobs.fail(f"{NAME}-worker-1", 137)  # killed: retried (exit code 1 is a permanent failure by default)
    wait_for(lambda: "  OOMKilled  Recovering  pods: views-worker-1" in cluster.ddpjob(
        "describe", NAME, "-n", namespace).stdout, timeout=30, describe="describe shows incident 1 recovering",
        state=lambda: jobs.describe(NAME))
    recover(cluster, jobs, namespace, 1, 45)
    scraped(prometheus, namespace, 45)
    cluster.kubectl("delete", "pod", f"{NAME}-worker-0", "-n", namespace, "--wait=false")
    recover(cluster, jobs, namespace, 2, 52)

    text = cluster.ddpjob("describe", NAME, "-n", namespace).stdout
    (tmp_path / "describe.txt").write_text(text)
    lines = text.splitlines()
    heads = [line for line in lines if line.startswith("  #")]
    assert [h.split()[0] for h in heads] == ["#1", "#2"], text
    assert [h.split()[2:4] for h in heads] == [["OOMKilled", "Recovered"], ["PodDeleted", "Recovered"]], text
    assert f"pods: {NAME}-worker-1" in heads[0] and f"pods: {NAME}-worker-0" in heads[1], text
    first = lines.index(heads[0])
    block = lines[first:lines.index(heads[1])]
    # Each incident's phases in order, ending at the first step, and the Events the operator posted for it.
    assert any(line.strip().startswith("phases: replacementCreated +") and "firstStep +" in line
               for line in block), block
    assert any("Warning WorkerFailed: worker 1" in line and "incident #1" in line for line in block), block
    assert "Workers:     2/2 ready, 2 pod(s) replaced" in lines, text
    assert "Incidents:   2 of backoffLimit 5" in lines, text

    row = cluster.ddpjob("list", "-n", namespace).stdout.splitlines()[1].split()
    assert row[:6] == [NAME, "Running", "2/2", "52/100", "(52%)", "2"], row
    lost, goodput = row[6], row[7]
    assert lost != "0.0s" and float(goodput.rstrip("%")) < 100, row
    everywhere = cluster.ddpjob("list", "-A").stdout
    assert any(line.split()[:2] == [namespace, NAME] for line in everywhere.splitlines()), everywhere
    check_metrics(operator.metrics(), namespace)
    picture = tmp_path / "views.png"
    said = cluster.ddpjob("report", NAME, "-n", namespace, "-o", str(picture)).stdout
    assert said.startswith(f"{picture}: {namespace}/{NAME}: Running, 2 incident(s), goodput "), said
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and picture.stat().st_size > 10_000
    from_prometheus(cluster, namespace, prometheus, tmp_path)
    dashboard_answers(prometheus)


def scraped(url: str, namespace: str, step: int) -> None:
    """Wait until Prometheus holds ``step`` as the job's latest sample, then two scrapes more: the range query's
    one-second grid then has a point on it, however the scrapes fall."""
    from ddpjob_operator.views import prometheus as prom

    def latest() -> int | None:
        now = datetime.now(UTC)
        points = prom.steps(url, namespace, NAME, now - timedelta(seconds=5), now)
        return points[-1][1] if points else None

    wait_for(lambda: latest() == step, timeout=30, describe=f"Prometheus scraped step {step}", state=latest)
    time.sleep(2)


def from_prometheus(cluster: Cluster, namespace: str, url: str, tmp_path: Path) -> None:
    """`report --prometheus`: the job's steps as Prometheus scraped them (each step the progress named, in
    order), drawn with the status' points."""
    from ddpjob_operator.views import prometheus as prom

    now = datetime.now(UTC)
    wait_for(lambda: 52 in {s for _, s in prom.steps(url, namespace, NAME, now - timedelta(minutes=5), now)},
             timeout=30, describe="step 52 scraped")
    seen = [s for _, s in prom.steps(url, namespace, NAME, now - timedelta(minutes=5), datetime.now(UTC))]
    assert [s for i, s in enumerate(seen) if i == 0 or s != seen[i - 1]] == [40, 45, 52], seen
    picture = tmp_path / "from-prometheus.png"
    said = cluster.ddpjob("report", NAME, "-n", namespace, "-o", str(picture), "--prometheus", url)
    samples = int(said.stdout.rsplit("(", 1)[1].split()[0])
    assert samples >= len(seen) - 2 and picture.stat().st_size > 10_000, said.stdout
    wrong = cluster.ddpjob("report", NAME, "-n", namespace, "-o", str(picture), "--prometheus",
                           "http://127.0.0.1:9", check=False)
    assert wrong.returncode == 1 and wrong.stderr.startswith("ddpjob: cannot read Prometheus at http://127.0.0.1:9"), (
        wrong.stderr)


def instant(url: str, expr: str) -> Any:
    """Prometheus' answer to an instant query."""
    query = urllib.parse.urlencode({"query": expr})
    return json.loads(urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=10).read())


def dashboard_answers(url: str) -> None:
    """Every query of the chart's Grafana dashboard, run by a real Prometheus that scraped an operator through
    faults: each parses and each has data (Grafana itself is not used here: AGPL). Grafana's variables become what
    it would send: every scrape job, a one-minute rate window."""
    dashboard = json.loads((REPO / "charts" / "ddpjob-operator" / "files" / "ddpjob-dashboard.json").read_text())
    empty = []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"].replace("$job", ".*").replace("$__rate_interval", "1m")
            answer = instant(url, expr)
            assert answer["status"] == "success", (panel["title"], expr, answer)
            if not answer["data"]["result"]:
                empty.append(f"{panel['title']}: {expr}")
    assert not empty, "dashboard queries without data:\n" + "\n".join(empty)


def check_metrics(scrape: str, namespace: str) -> None:
    """`promtool check metrics` on a live scrape (after faults, so the labelled series exist): the names, types,
    units and help texts pass Prometheus' own lint; and the figures over all jobs are there."""
    from tests.cluster.controlplane import tool

    lint = subprocess.run([str(tool("promtool")), "check", "metrics"], input=scrape, capture_output=True, text=True,
                          timeout=30)
    assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), lint.stdout + lint.stderr
    for name in ("ddpjob_workqueue_depth", "ddpjob_workqueue_latency_seconds_count",
                 'ddpjob_api_request_duration_seconds_count{resource="pods",verb="POST"}',
                 "ddpjob_jobs_recovering", "ddpjob_checkpoint_age_max_seconds",
                 'ddpjob_incidents_total{cause="PodDeleted"}',
                 f'ddpjob_job_global_step{{ddpjob_name="{NAME}",ddpjob_namespace="{namespace}"}} 52.0'):
        assert name in scrape, (name, scrape)
    # The writes and loads the job's progress named went through the CRD's schema (not pruned) into the
    # histograms: three checkpoints (30, 40, 50), three group starts, once each.
    counts = {line.split()[0]: float(line.split()[1]) for line in scrape.splitlines()
              if line.startswith(("ddpjob_checkpoint_save_seconds_count", "ddpjob_checkpoint_load_seconds_count"))}
    assert counts == {"ddpjob_checkpoint_save_seconds_count": 3.0, "ddpjob_checkpoint_load_seconds_count": 3.0}, counts


def test_watch_redraws_on_change_and_ends_when_the_job_finishes(cluster: Cluster, namespace: str,
                                                              operator: OperatorProcess, jobs: Jobs) -> None:
    jobs.apply(small_job(NAME, 1))
    jobs.running(NAME, 1)
    watch = subprocess.Popen(["kubectl", "ddpjob", "describe", NAME, "-n", namespace, "--watch", "--interval",
                              "0.3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=cluster.plugin_env())
    try:
        time.sleep(3)
        report(cluster, namespace, 7)
        time.sleep(2)
        jobs.succeed(f"{NAME}-worker-0")
        out, err = watch.communicate(timeout=60)
    finally:
        watch.kill()
    assert watch.returncode == 0, err
    views = out.split("\nName:")
    assert len(views) >= 3, out  # the first view, the step, the end (and what changed between)
    assert "step 7/100" in out and "State:       Succeeded" in views[-1], out


def test_one_clear_line_for_a_job_that_does_not_exist(cluster: Cluster, namespace: str, ddpjob_crd: str) -> None:
    proc = cluster.ddpjob("describe", "nope", "-n", namespace, check=False)
    assert proc.returncode == 1 and proc.stdout == "", proc
    assert proc.stderr == f"ddpjob: no DDPJob 'nope' in namespace {namespace} (kubectl get ddpjobs -A lists them " \
                          "all)\n", proc.stderr

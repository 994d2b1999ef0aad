"""Hot spares on a real cluster: a 2-worker job with ``spares: 1`` loses a training pod; the spare, already
waiting at the rendezvous, takes its place in the next round, the pod created for the lost one becomes the new
spare (and is never needed: it exits 0 when the job ends), the final model is bitwise the uninterrupted run's, and
the recovery clock (status.incidents[].phases, status.lastRecoverySeconds, the operator's /metrics) shows it.
Fixtures in conftest.py; the reference run is test_training.py's."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.conftest import wait_for
from tests.e2e import faults
from tests.e2e import training as t
from tests.e2e.background import Background
from tests.e2e.runs import JOB, Env, Run, assert_same_model, run_job

pytestmark = pytest.mark.timeout(1500)

METRICS_SCRIPT = r"""
import urllib.request
print(urllib.request.urlopen("http://127.0.0.1:8080/metrics", timeout=10).read().decode())
"""


def operator_metrics(env: Env) -> str:
    """The leading operator's /metrics, read inside its pod (no port-forward needed; a standby counts nothing)."""
    pod = faults.holder_pod(faults.leader(env.cluster)) or t.operator_pods(env.cluster)[0]
    return env.cluster.kubectl("exec", "-n", t.OPERATOR_NS, pod, "--", "python", "-c", METRICS_SCRIPT).stdout


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{}"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_spares(env: Env, ns: str, want: str) -> dict[str, Any]:
    found = wait_for(lambda: (s := t.job_status(env.cluster, ns, JOB)).get("spares") == want and
                     s.get("ready") == "2/2" and s, timeout=300, interval=0.5, describe=f"status.spares {want}",
                     state=lambda: t.describe_job(env.cluster, ns, JOB))
    assert isinstance(found, dict)
    return found


def spare_scenario(env: Env, ns: str, created: float) -> dict[str, Any]:
    cluster = env.cluster
    capture = faults.LogCapture(cluster, ns)
    status = faults.wait_quiet(cluster, ns, 0)
    wait_spares(env, ns, "1/1")
    pods = sorted(p["metadata"]["name"] for p in t.worker_pods(cluster, ns, JOB)
                  if p["metadata"]["labels"].get("ddpjob.io/replica-type") == "worker")
    training = [p for p in pods if t.has_trainer(cluster, ns, p)]
    spare = [p for p in pods if p not in training]
    assert len(training) == 2 and len(spare) == 1, f"training {training}, spare {spare}"
    victim = training[-1]
    before = metric(operator_metrics(env), 'ddpjob_recovery_phase_seconds_count{phase="firstStep"}')
    checkpoint = int(status["progress"]["lastCheckpoint"]["step"])  # type: ignore[index]
    capture()
    at = time.time()
    cluster.kubectl("delete", "pod", victim, "-n", ns, "--wait=false")
    t.log(f"spares: deleted {victim} (training) after checkpoint step-{checkpoint}; spare {spare[0]}")
    capture()
    faults.wait_incidents(cluster, ns, 1)
    after_fault = faults.wait_quiet(cluster, ns, checkpoint)
    recovered = wait_spares(env, ns, "1/1")  # the pod created for the lost one is the new spare
    capture()
    new_pod = next(p["metadata"] for p in t.worker_pods(cluster, ns, JOB) if p["metadata"]["name"] == victim)
    after = metric(operator_metrics(env), 'ddpjob_recovery_phase_seconds_count{phase="firstStep"}')
    return {"victim": victim, "spare": spare[0], "at": at, "checkpoint": checkpoint, "status": recovered,
            "quiet": after_fault, "new_uid": new_pod["uid"], "metric_before": before, "metric_after": after,
            "logs": capture.texts}


@pytest.mark.exclusive
def test_spare_takes_over_a_lost_worker_bitwise(env: Env, background: Background, reference: Run) -> None:
    """``spares: 1``: the spare trains after the fault, the replacement waits as the new spare until the end,
    the model is the reference's bit for bit, and the recovery clock is in status and in /metrics. Alone: the
    /metrics count it checks is the operator's, which any other job's recovery would raise too."""
    background.drain()
    run = run_job(env, "spares", spare_scenario, claim=False, spares=1)
    x = run.extra
    assert_same_model(run, reference)
    joined = [(ts, pod) for ts, pod, line in run.logs.lines
              if "rendezvous complete: this pod is in the group" in line and ts > x["at"]]
    pods_joined = {pod.split("@")[0] for _, pod in joined}
    assert x["spare"] in pods_joined, f"the spare {x['spare']} never joined a group after the fault: {joined}"
    replacement = [pod for _, pod in joined if pod.split("@")[0] == x["victim"] and x["new_uid"] in pod]
    assert not replacement, f"the replacement pod joined a group: the spare did not take over ({joined})"
    incident = x["status"]["incidents"][-1]
    phases = incident.get("phases") or {}
    assert incident["outcome"] == "Recovered" and {"rendezvous", "checkpointLoaded", "firstStep"} <= phases.keys(), \
        json.dumps(incident)
    assert phases["rendezvous"] <= phases["checkpointLoaded"] <= phases["firstStep"], phases
    assert x["status"].get("lastRecoverySeconds") == phases["firstStep"], x["status"]
    assert x["metric_after"] >= x["metric_before"] + 1, (x["metric_before"], x["metric_after"])
    first = run.logs.first_step_after(x["at"])
    t.log(f"spares: {x['victim']} deleted; {x['spare']} took over; first step {first and first - x['at']:.1f}s "
          f"after the deletion; status phases {phases}")
    assert run.status.get("spares") in (None, "0/1", "1/1")

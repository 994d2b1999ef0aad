"""Plain scripts, unchanged, on the real nodes: their progress reaches the DDPJob without a line of ddpjob in them,
and the stall clocks judge them right (issue 28).

Four jobs run at once, each in its own namespace, their scripts mounted from a ConfigMap as a user would ship them:
- **tutorial**: the PyTorch DDP tutorial's multinode script (worker/ddpjob_worker/examples/tutorial_ddp.py, the
  tutorial's code), `progressDeadlineSeconds: 30`, trains for four deadlines after its first step: no incident,
  never Stalled, its steps and step rate in `status.progress` and `kubectl get ddpj`. Before the runtime counted
  optimizer steps, the operator restarted it as stalled every deadline.
- **hang**: a plain script that keeps its own checkpoint (torch.save on each pod's emptyDir, no claim) and hangs
  once after step 20: Stalled within the deadline, "stopped after step 20"; `onStall: RestartGroup` restarts the
  group in place (issue 23 #11): the same two pods throughout, the script resumes from its step-20 checkpoint and
  the job Succeeds with one incident. Before, the restart deleted the pods and with them every checkpoint.
- **slow start**: sleeps 50 s before its first step, longer than its 20 s step deadline, within its 150 s start-up
  allowance, and takes 30 s to exit after its last step (an atexit upload): Succeeded, no incident, never Stalled.
  Before the runtime said when the script returned (``progress.finishTime``), a slow exit was a stall after the
  last step (a CI run on 2026-11-27: 28 s from the last step to the kubelet's report of the exit, under load).
- **stuck start**: never steps, start-up allowance 60 s: Stalled naming the start-up.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_for
from tests.e2e import results
from tests.e2e import training as t
from tests.e2e.background import Background, runs_in_background
from tests.e2e.runs import Env, fresh_namespace

pytestmark = [pytest.mark.timeout(900), pytest.mark.background("plain-scripts")]

SCRIPTS = {
    "tutorial_ddp.py": t.REPO / "worker" / "ddpjob_worker" / "examples" / "tutorial_ddp.py",
    "plain_steps.py": Path(__file__).parent / "scripts" / "plain_steps.py",
}
JOB = "plain"
TUTORIAL_DEADLINE = 30
HANG_AFTER, HANG_DEADLINE, HANG_STEPS = 20, 30, 60
SLOW_SLEEP, SLOW_DEADLINE, SLOW_STARTUP, SLOW_EXIT = 50, 20, 150, 30
STUCK_DEADLINE, STUCK_STARTUP = 20, 60
#: Fewer idle processes on two cores (no pre-started trainer) for the jobs that mostly wait; the tutorial keeps
#: the defaults.
NO_STANDBY = [{"name": "DDPJOB_WARM_TRAINERS", "value": "0"}]


@dataclass
class Case:
    """One job of the module and what the watcher saw of it."""

    label: str
    args: list[str]
    policy: dict[str, Any]
    replicas: int = 2
    env: list[dict[str, str]] = field(default_factory=list)
    cpu_limit: str | None = None
    """The tutorial trains as fast as it can: a limit keeps both cores from going to it alone."""
    ns: str = ""
    stalled: dict[str, Any] | None = None
    """The first `Stalled` Event (message, time) and the status when the watcher saw it."""
    max_incidents: int = 0
    status: dict[str, Any] = field(default_factory=dict)
    first_step: float | None = None
    """When the watcher first saw a step in status.progress."""
    table: str = ""
    """`kubectl get ddpj` once the case concluded (its namespace goes with the run)."""
    worker_uids: set[str] = field(default_factory=set)
    """Every worker pod UID seen (the hang case: an in-place restart keeps the pods)."""
    logs: str = ""
    """The workers' logs once the case concluded (the hang case)."""

    def done(self) -> bool:
        """Concluded: what the test asserts has happened, or cannot happen any more."""
        if self.status.get("state") in ("Succeeded", "Failed"):
            return True
        if self.label == "hang":
            return self.max_incidents > 1  # it hangs once: a second incident is a failure already
        if self.label == "tutorial":
            trained = self.first_step is not None and time.time() - self.first_step >= 4 * TUTORIAL_DEADLINE + 5
            return trained or self.max_incidents > 0
        if self.label == "slow start":
            return self.max_incidents > 0
        return self.stalled is not None


def cases() -> list[Case]:
    plain = ["python", "/scripts/plain_steps.py"]
    return [
        Case("tutorial", ["python", "/scripts/tutorial_ddp.py", "100000", "50", "--snapshot_path",
                          "/checkpoints/snapshot.pt"], {"progressDeadlineSeconds": TUTORIAL_DEADLINE},
             cpu_limit="500m"),
        Case("hang", [*plain, "--steps", str(HANG_STEPS), "--hang-after", str(HANG_AFTER), "--hang-once",
                      "--checkpoint", "/checkpoints/plain.pt", "--save-every", "10", "--step-seconds", "0.2"],
             {"progressDeadlineSeconds": HANG_DEADLINE}, env=NO_STANDBY),
        Case("slow start", [*plain, "--steps", "20", "--sleep-before", str(SLOW_SLEEP), "--exit-seconds",
                            str(SLOW_EXIT)],
             {"progressDeadlineSeconds": SLOW_DEADLINE, "startupDeadlineSeconds": SLOW_STARTUP}, replicas=1,
             env=NO_STANDBY),
        Case("stuck start", [*plain, "--sleep-before", "100000"],
             {"progressDeadlineSeconds": STUCK_DEADLINE, "startupDeadlineSeconds": STUCK_STARTUP}, replicas=1,
             env=NO_STANDBY),
    ]


def manifest(env: Env, case: Case) -> dict[str, Any]:
    """The job as a user ships a script: a ConfigMap mounted into the stock worker image; no checkpoint claim."""
    job = t.ddpjob_manifest(JOB, case.ns, node_selector=env.node_selector, args=case.args, claim=False,
                            run_policy=case.policy,
                            pod_spec={"volumes": [{"name": "scripts", "configMap": {"name": "scripts"}}]})
    job["spec"]["replicas"] = case.replicas
    container = job["spec"]["template"]["spec"]["containers"][0]
    container["volumeMounts"] = [{"name": "scripts", "mountPath": "/scripts"}]
    container["env"] = [*container["env"], *case.env]
    if case.cpu_limit:
        container["resources"]["limits"]["cpu"] = case.cpu_limit
    return job


def stalled_event(env: Env, ns: str) -> dict[str, Any] | None:
    """The job's first `Stalled` Warning Event: its message and the operator's time of it. An Event, not the
    condition: a RestartGroup stall turns the condition into RestartedAfterStall a pass later, faster than a poll."""
    events = t.get_json(env.cluster, "events", "-n", ns, "--field-selector", "reason=Stalled")["items"]
    stamps = [(e.get("firstTimestamp") or e.get("eventTime") or e["metadata"]["creationTimestamp"], e)
              for e in events if e["involvedObject"].get("kind") == "DDPJob"]
    if not stamps:
        return None
    stamp, event = min(stamps, key=lambda item: t.parse_ts(item[0]))
    return {"message": event["message"], "type": event["type"], "at": t.parse_ts(stamp)}


def observe(env: Env, case: Case) -> None:
    case.status = t.job_status(env.cluster, case.ns, JOB)
    if case.label == "hang":
        pods = t.get_json(env.cluster, "pods", "-n", case.ns, "-l", "ddpjob.io/replica-type=worker")["items"]
        case.worker_uids |= {p["metadata"]["uid"] for p in pods}
    case.max_incidents = max(case.max_incidents, int(case.status.get("incidentCount") or 0))
    if case.first_step is None and (case.status.get("progress") or {}).get("lastStepTime"):
        case.first_step = time.time()
    stalled = any(c["type"] == "Stalled" and c["status"] == "True" for c in case.status.get("conditions") or [])
    if case.stalled is None and (stalled or case.max_incidents):
        event = stalled_event(env, case.ns)
        if event is not None:
            case.stalled = {**event, "progress": case.status.get("progress") or {},
                            "incidents": case.status.get("incidents") or []}


@runs_in_background("plain-scripts")
def run_plain_scripts(env: Env) -> dict[str, Case]:
    """Every case created at once, watched every 2 s until each one concluded; namespaces deleted after."""
    runs = cases()
    data = {name: path.read_text() for name, path in SCRIPTS.items()}
    try:
        for case in runs:
            case.ns = fresh_namespace(env.cluster, case.label.replace(" ", "-"))
            env.cluster.kubectl("create", "configmap", "scripts", "-n", case.ns,
                                *(f"--from-literal={k}={v}" for k, v in data.items()))
            env.cluster.kubectl("apply", "-f", "-", stdin=json.dumps(manifest(env, case)))
        t.log(f"plain scripts: {', '.join(f'{c.label} in {c.ns}' for c in runs)}")

        def all_done() -> bool:
            for case in runs:
                observe(env, case)
            return all(case.done() for case in runs)

        wait_for(all_done, timeout=720, interval=2, describe="every plain-script case concluded",
                 state=lambda: "\n".join(f"{c.label}: {t.describe_job(env.cluster, c.ns, JOB)}" for c in runs))
        for case in runs:
            case.table = env.cluster.kubectl("get", "ddpj", JOB, "-n", case.ns).stdout
        hang = next(case for case in runs if case.label == "hang")
        hang.logs = "\n".join(env.cluster.kubectl("logs", "-n", hang.ns, f"{JOB}-worker-{i}", check=False).stdout
                              for i in range(hang.replicas))
        for case in runs:
            t.log(f"plain scripts: {case.label}: state {case.status.get('state')}, incidents {case.max_incidents}, "
                  f"stalled {(case.stalled or {}).get('message')}, progress {json.dumps(case.status.get('progress'))}")
        return {case.label: case for case in runs}
    finally:
        for case in runs:
            if case.ns:
                env.cluster.kubectl("delete", "namespace", case.ns, "--wait=false", check=False)


@pytest.fixture(scope="module")
def plain_runs(background: Background) -> dict[str, Case]:
    runs: dict[str, Case] = background.result("plain-scripts")
    return runs


def test_the_tutorial_script_unchanged_reports_its_steps_and_is_never_restarted(
        env: Env, plain_runs: dict[str, Case]) -> None:
    case = plain_runs["tutorial"]
    assert case.first_step is not None and time.time() - case.first_step >= 4 * TUTORIAL_DEADLINE, case.status
    assert case.max_incidents == 0 and case.stalled is None, (case.stalled, case.status.get("incidents"))
    progress = case.status["progress"]
    assert progress["source"] == "OptimizerSteps" and progress["globalStep"] > 0, progress
    assert progress["stepRate"] > 0 and "epoch" not in progress, progress
    stalled = next(c for c in case.status["conditions"] if c["type"] == "Stalled")
    assert stalled["reason"] == "Progressing" and "optimizer steps" in stalled["message"], stalled


def test_kubectl_get_shows_the_steps_and_the_rate(plain_runs: dict[str, Case]) -> None:
    table = plain_runs["tutorial"].table
    header, row = table.splitlines()[:2]
    # Cut the row at the header's column starts: an empty cell (EPOCH: the script reports none) is blanks.
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    values = {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)}
    assert int(values["STEP"]) > 0 and float(values["STEPS/S"]) > 0, table
    t.log(f"kubectl get ddpj:\n{table}")


def test_a_script_that_hangs_after_n_steps_is_stalled_within_the_deadline(plain_runs: dict[str, Case]) -> None:
    case = plain_runs["hang"]
    assert case.stalled is not None, case.status
    assert case.stalled["type"] == "Warning" and case.stalled["incidents"][0]["cause"] == "Stalled", case.stalled
    # ProgressStopped's words: the step it stopped after, and who counted it.
    message = case.stalled["message"]
    assert message.startswith(f"training stopped after step {HANG_AFTER} (optimizer steps counted"), message
    last_step = t.parse_ts(case.stalled["progress"]["lastStepTime"])
    detected = case.stalled["at"] - last_step  # the operator's time of the Event (whole seconds)
    t.log(f"hang: Stalled {detected:.1f}s after the last step (progressDeadlineSeconds {HANG_DEADLINE})")
    assert HANG_DEADLINE - 1 <= detected <= HANG_DEADLINE + 10, detected


def test_the_stalled_group_restarts_in_place_and_resumes_from_its_own_checkpoint(plain_runs: dict[str, Case]) -> None:
    """Issue 23 #11: the restart keeps the pods, so the checkpoints on their emptyDirs are there to resume from."""
    case = plain_runs["hang"]
    assert case.status.get("state") == "Succeeded" and case.max_incidents == 1, case.status
    incident = case.status["incidents"][0]
    assert (incident["cause"], incident["restart"], incident["outcome"]) == ("Stalled", "InPlace", "Recovered")
    assert len(case.worker_uids) == case.replicas, case.worker_uids  # the same pods from start to end
    assert case.logs.count(f"resumed from step {HANG_AFTER}") == case.replicas, case.logs[-3000:]
    assert case.logs.count(f"step {HANG_STEPS}\n") == case.replicas and "resumed from step 0" not in case.logs
    t.log(f"hang: restarted in place, recovered in {incident.get('recoverySeconds')}s "
          f"(phases {json.dumps(incident.get('phases'))}); pods {sorted(case.worker_uids)}")
    results.record("stall-in-place", incidents=case.max_incidents, recovery_s=incident.get("recoverySeconds"),
                   phases=incident.get("phases"), pods=len(case.worker_uids))


def test_a_slow_start_within_the_allowance_is_no_incident(plain_runs: dict[str, Case]) -> None:
    case = plain_runs["slow start"]
    assert case.status.get("state") == "Succeeded", case.status
    assert case.max_incidents == 0 and case.stalled is None, (case.stalled, case.status.get("incidents"))
    progress = case.status["progress"]
    start = t.parse_ts(progress["start"]["rendezvousTime"])
    first = t.parse_ts(progress["start"]["firstStepTime"])
    t.log(f"slow start: first step {first - start:.0f}s after the rendezvous (step deadline {SLOW_DEADLINE}s, "
          f"start-up allowance {SLOW_STARTUP}s)")
    assert first - start >= SLOW_SLEEP > SLOW_DEADLINE and progress["globalStep"] == 20, progress
    # Its exit outlasted the step deadline: the script returned (finishTime), then the atexit upload ran.
    last, finish = t.parse_ts(progress["lastStepTime"]), t.parse_ts(progress["finishTime"])
    done = t.parse_ts(case.status["completionTime"])
    t.log(f"slow start: returned {finish - last:.1f}s after its last step, done {done - last:.0f}s after it "
          f"(step deadline {SLOW_DEADLINE}s)")
    assert 0 <= finish - last < SLOW_DEADLINE and done - last >= SLOW_EXIT > SLOW_DEADLINE, case.status


def test_a_start_up_past_the_allowance_is_stalled_naming_the_start_up(plain_runs: dict[str, Case]) -> None:
    case = plain_runs["stuck start"]
    assert case.stalled is not None, case.status
    assert case.stalled["type"] == "Warning" and case.stalled["incidents"][0]["cause"] == "Stalled", case.stalled
    # NoProgressSinceStart's words: no step since the group started, past the start-up allowance.
    message = case.stalled["message"]
    assert f"past the start-up allowance (startupDeadlineSeconds {STUCK_STARTUP})" in message, message
    assert "lastStepTime" not in case.stalled["progress"], case.stalled
    started = re.search(r"no step since the group started at (\S+Z):", message)
    assert started is not None, message
    after = case.stalled["at"] - t.parse_ts(started[1])
    t.log(f"stuck start: Stalled {after:.0f}s after the group started (startupDeadlineSeconds {STUCK_STARTUP})")
    assert STUCK_STARTUP <= after <= STUCK_STARTUP + 10, after

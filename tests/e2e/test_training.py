"""Real DDP training on a real cluster: the uninterrupted reference run, and a job with no checkpoint claim (each
pod keeps its checkpoints on its own emptyDir) that survives kill -9 of a trainer and the deletion of either
worker's pod, resuming each time from a checkpoint received from the peer that still holds it.

The Helm-installed operator runs a 2-worker CPU DDPJob of the example trainer (tests/e2e/training.py has the
settings). Every faulted run must end with the reference's parameters, bit for bit (the sha256 rank 0 logs over
every tensor's bytes, and final.pt on the PV where there is one), and with the same loss, step for step, for
every step it logged (`--log-every 1`, rank-tagged). The soak is in test_soak.py; fixtures in conftest.py.

Runs on any KUBECONFIG whose cluster has ddpjob-worker:dev and ddpjob-operator:0.1.0 (kind: `kind load
docker-image`); without one, on the local real node (the session fixture), into which the images are imported.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.e2e import faults, results
from tests.e2e import training as t
from tests.e2e.background import Background, runs_in_background
from tests.e2e.runs import Env, Run, assert_same_model, run_job

pytestmark = pytest.mark.timeout(1500)


def test_uninterrupted_run_trains_writes_checkpoints_and_succeeds(reference: Run) -> None:
    """Helm-installed operator, 2 real workers, the example trainer: Succeeded, checkpoints and the final model on
    the PV, progress reported to the DDPJob's status, no incident."""
    status = reference.status
    assert status["state"] == "Succeeded" and status.get("incidentCount", 0) == 0, status.get("incidents")
    assert status["progress"]["globalStep"] == t.TOTAL_STEPS
    assert status["progress"]["lastCheckpoint"]["step"] == t.TOTAL_STEPS
    assert f"step-{t.TOTAL_STEPS}" in reference.entries and "final.pt" in reference.entries, reference.entries
    assert reference.volume_sha256 == reference.params_sha256, "final.pt on the PV differs from the logged digest"
    assert not reference.logs.resumes(), "an uninterrupted run must start from scratch and never resume"
    assert len(reference.losses) == 2 * t.TOTAL_STEPS, "both ranks log every step"
    assert any("checkpoint step-" in line for _, _, line in reference.logs.lines)


NO_CLAIM_FAULTS = [
    faults.Fault("kill -9 of the trainer in worker-1", "kill -9", faults.kill9(1), 0),
    faults.Fault("delete worker-0", "pod deleted", faults.delete("worker-0"), 1),
    faults.Fault("delete worker-1", "pod deleted", faults.delete("worker-1"), 1),
]


def no_claim_scenario(env: Env, ns: str, created: float) -> dict[str, Any]:
    injected: list[dict[str, Any]] = []
    capture = faults.LogCapture(env.cluster, ns)
    checkpoint = 0
    for fault in NO_CLAIM_FAULTS:
        status = faults.wait_quiet(env.cluster, ns, checkpoint)
        checkpoint = int(status["progress"]["lastCheckpoint"]["step"])  # type: ignore[index]
        capture()
        at = time.time()
        fault.inject(env.cluster, ns)
        capture()
        t.log(f"no claim: {fault.name} after checkpoint step-{checkpoint}")
        if fault.incidents:
            faults.wait_incidents(env.cluster, ns, len([f for f in injected if f["incidents"]]) + 1)
        injected.append({"fault": fault.name, "at": at, "checkpoint": checkpoint, "incidents": fault.incidents})
    return {"faults": injected, "logs": capture.texts}


@runs_in_background("no-claim")
def no_claim_run(env: Env) -> Run:
    return run_job(env, "no-claim", no_claim_scenario, claim=False)


@pytest.mark.background("no-claim")
def test_no_claim_survives_kill9_and_each_worker_pod_deleted(background: Background, reference: Run) -> None:
    """The API default (no checkpoint.volumeClaim: a per-pod emptyDir): every pod keeps a full copy; a restarted
    group resumes from its own copies; a replaced pod's empty volume is filled from its peer over the process
    group. Every resume is from a checkpoint (not step 0), and the run ends bitwise equal to the reference."""
    run = background.result("no-claim")
    for item in run.extra["faults"]:
        resumes = [(w, pod, step) for w, pod, step in run.logs.resumes(item["at"])]
        assert resumes, f"no resume after {item['fault']}\n{run.logs.text()}"
        first = min(step for _, _, step in resumes)
        assert first >= item["checkpoint"] > 0, f"{item['fault']}: resumed from step-{first}, not the checkpoint"
        recovery = run.logs.first_step_after(item["at"])
        item["recovery_s"] = round(recovery - item["at"], 1) if recovery else None
        t.log(f"no claim: {item['fault']}: resumed from step-{first}, first step {item['recovery_s']}s after it")
    received = [line for _, _, line in run.logs.lines if "received from rank" in line]
    assert received, "a replaced pod must have received the checkpoint from its peer"
    assert run.status["incidentCount"] == 2, run.status.get("incidents")
    results.record("no-claim", wall_seconds=round(run.wall_seconds, 1), incidents=run.status["incidentCount"],
                   params=run.params_sha256[:16], faults=run.extra["faults"])
    assert_same_model(run, reference)

"""The text of `kubectl ddpjob describe` and `list` from a status with incidents, Events and progress."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ddpjob_operator.views import describe, listing
from ddpjob_operator.views.kubectl import explain

NOW = datetime(2026, 11, 27, 12, 10, 0, tzinfo=UTC)

JOB: dict[str, Any] = {
    "metadata": {"name": "charlm", "namespace": "ml", "creationTimestamp": "2026-11-27T11:59:58Z", "uid": "u"},
    "spec": {"replicas": 2, "runPolicy": {"backoffLimit": 6}},
    "status": {
        "state": "Running", "ready": "2/2", "spares": "1/1", "restarts": 1, "incidentCount": 1,
        "startTime": "2026-11-27T12:00:00Z",
        "conditions": [
            {"type": "Running", "status": "True", "reason": "AllWorkersRunning", "message": "2 worker(s) running"},
            {"type": "Created", "status": "True", "reason": "JobCreated", "message": "accepted"},
        ],
        "progress": {"globalStep": 400, "totalSteps": 1000, "epoch": 1, "stepRate": 2.0, "source": "Reporter",
                     "lastStepTime": "2026-11-27T12:09:59Z",
                     "lastCheckpoint": {"step": 390, "time": "2026-11-27T12:09:55Z"}},
        "incidents": [{"id": 1, "cause": "NodeLost", "startTime": "2026-11-27T12:05:00Z", "outcome": "Recovered",
                       "pods": ["charlm-worker-1"], "message": "node n4 unreachable", "recoverySeconds": 6.0,
                       "recoveredTime": "2026-11-27T12:05:06Z",
                       "phases": {"firstStep": 6.0, "detection": 5.1, "rendezvous": 5.5, "checkpointLoaded": 5.9}}],
    },
}
EVENTS: list[dict[str, Any]] = [
    {"type": "Warning", "reason": "NodeLost", "message": "charlm-worker-1 silent on n4",
     "lastTimestamp": "2026-11-27T12:05:05Z", "count": 1},
    {"type": "Normal", "reason": "AllWorkersRunning", "message": "2 worker(s) running",
     "lastTimestamp": "2026-11-27T12:00:04Z"},
]


def test_describe_shows_state_progress_checkpoint_spares_and_the_incident_timeline() -> None:
    text = describe.render(JOB, EVENTS, NOW)
    lines = text.splitlines()
    assert "State:       Running (AllWorkersRunning: 2 worker(s) running)" in lines
    assert "Workers:     2/2 ready, spares 1/1 ready/wanted, 1 pod(s) replaced" in lines
    assert "Progress:    [########------------]   40%  step 400/1000  epoch 1  2.00 steps/s  ETA 5m" in lines
    assert "Checkpoint:  step 390, 5.0s ago" in lines
    assert "Goodput:     99.0% (failures cost 6.0s of 10m)" in lines
    assert "Incidents:   1 of backoffLimit 6" in lines
    at = lines.index("  #1 12:05:00  NodeLost  Recovered in 6.0s  pods: charlm-worker-1")
    # The phases in the order they happen, then the incident's own Event; the other Event stays outside.
    assert lines[at + 2] == ("      phases: detection +5.1s  rendezvous +5.5s  checkpointLoaded +5.9s  "
                             "firstStep +6.0s")
    assert lines[at + 3] == "      12:05:05 Warning NodeLost: charlm-worker-1 silent on n4"
    assert lines.index("Events outside incidents:") < lines.index(
        "  12:00:04 Normal  AllWorkersRunning: 2 worker(s) running")
    assert lines.index("  Created  True    JobCreated: accepted") < lines.index(
        "  Running  True    AllWorkersRunning: 2 worker(s) running")


def test_describe_of_a_job_that_has_not_stepped_yet() -> None:
    job = {"metadata": {"name": "j", "namespace": "ml"}, "spec": {"replicas": 2}, "status": {}}
    text = describe.render(job, [], NOW)
    assert "Progress:    no step reported yet" in text and "Checkpoint:  none reported yet" in text
    assert "Workers:     0/2 ready, 0 pod(s) replaced" in text
    assert "Events outside incidents: none" in text


def test_list_has_a_row_per_job_sorted_with_loss_and_goodput() -> None:
    other = {"metadata": {"name": "a", "namespace": "ml", "creationTimestamp": "2026-11-27T12:09:00Z"},
             "status": {"state": "Queued"}}
    lines = listing.render([JOB, other], NOW).splitlines()
    assert lines[0].split() == list(listing.COLUMNS)
    assert lines[1].split() == ["ml", "a", "Queued", "-", "-", "0", "-", "-", "1m"]
    assert lines[2].split() == ["ml", "charlm", "Running", "2/2", "400/1000", "(40%)", "1", "6.0s", "99.0%", "10m2s"]
    assert listing.render([JOB], NOW, namespaces=False).split()[0] == "NAME"
    assert listing.render([], NOW) == "No DDPJobs found.\n"


def test_kubectls_errors_become_one_line_that_says_what_to_do() -> None:
    assert "CRD (ddpjobs.ddpjob.io) is not installed" in explain(
        'error: the server doesn\'t have a resource type "ddpjobs"\n', None)
    assert explain('Error from server (NotFound): ddpjobs.ddpjob.io "nope" not found\n', "ml") == (
        "ddpjob: no DDPJob 'nope' in namespace ml (kubectl get ddpjobs -A lists them all)")
    assert explain("error: context \"x\" does not exist\n", None) == (
        'ddpjob: kubectl failed: error: context "x" does not exist')


def test_describe_names_the_controller_of_a_job_managed_elsewhere() -> None:
    job = {"metadata": {"name": "j", "namespace": "ns"}, "spec": {"replicas": 2, "managedBy": "example.com/other"}}
    text = describe.render(job, [], datetime(2026, 12, 6, tzinfo=UTC))
    assert "Managed by:  example.com/other (spec.managedBy): this operator leaves the job alone" in text
    assert "Managed by" not in describe.render({**job, "spec": {"replicas": 2}}, [], datetime(2026, 12, 6, tzinfo=UTC))

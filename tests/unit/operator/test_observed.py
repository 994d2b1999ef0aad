"""PodView: what the planner reads of a pod, from the API server's representation."""

from __future__ import annotations

import pytest
from ddpjob_operator.api.formats import MAX_MESSAGE, count, truncate
from ddpjob_operator.planner.observation import PodView


def test_failed_worker_view() -> None:
    pod = {
        "metadata": {
            "name": "j-worker-2",
            "uid": "u",
            "creationTimestamp": "2026-01-01T12:00:00Z",
            "labels": {
                "ddpjob.io/replica-type": "worker",
                "ddpjob.io/replica-index": "2",
                "ddpjob.io/restart-generation": "4",
            },
        },
        "spec": {"nodeName": "n1"},
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {"name": "sidecar", "state": {"terminated": {"exitCode": 0}}},
                {
                    "name": "worker",
                    "state": {
                        "terminated": {
                            "exitCode": 137,
                            "reason": "OOMKilled",
                            "message": "killed",
                            "finishedAt": "2026-01-01T12:05:00Z",
                        }
                    },
                },
            ],
        },
    }
    view = PodView.from_pod(pod)
    assert (view.index, view.generation, view.exit_code, view.reason) == (2, 4, 137, "OOMKilled")
    assert view.termination_message == "killed" and view.terminated and not view.active
    assert view.finished_at is not None and view.finished_at.minute == 5


def test_evicted_pod_has_no_exit_code() -> None:
    view = PodView.from_pod(
        {
            "metadata": {"name": "p", "uid": "u", "labels": {}},
            "status": {"phase": "Failed", "reason": "Evicted", "message": "low memory"},
        }
    )
    assert view.exit_code is None and view.reason == "Evicted" and view.termination_message == "low memory"


def test_truncate_keeps_the_end() -> None:
    text = "x" * 5000 + "RuntimeError: boom"
    out = truncate(text)
    assert len(out) == MAX_MESSAGE and out.endswith("RuntimeError: boom") and out.startswith("...")


@pytest.mark.parametrize(("text", "expected"), [("7", 7), ("0", 0), (None, 0), ("", 0), ("-3", 0), ("x1", 0),
                                                ("1.5", 0), (12, 12)])
def test_a_generation_label_that_is_not_a_count_reads_as_zero(text: object, expected: int) -> None:
    """The operator's pod labels (restart and incident generations) and resourceVersions are parsed with count():
    a hand-edited label must never make a pass raise."""
    assert count(text) == expected

"""status.progress is written by worker pods; the API server bounds its size (issue 43 #11): what the worker
runtime writes is accepted, a field past its bound is refused and nothing of the patch is stored."""

from __future__ import annotations

import json
from typing import Any

from tests.conftest import Cluster
from tests.integration.operator_support import Jobs, small_job

NOW = "2026-11-29T10:00:00.123Z"


def patch(cluster: Cluster, ns: str, progress: dict[str, Any]) -> Any:
    return cluster.kubectl("patch", "ddpjob", "bounded", "-n", ns, "--subresource=status", "--type=merge",
                           "-p", json.dumps({"status": {"progress": progress}}), check=False)


def test_progress_within_its_bounds_is_stored_and_past_them_refused(cluster: Cluster, namespace: str,
                                                                    ddpjob_crd: str, jobs: Jobs) -> None:
    jobs.apply(small_job("bounded"))  # no operator here: only the API server's schema is tested
    written = {"source": "Reporter", "epoch": 1, "step": 4, "globalStep": 14, "totalSteps": 100, "stepRate": 2.5,
               "loss": 1.25, "lastStepTime": NOW, "updateTime": NOW, "finishTime": NOW,
               "lastCheckpoint": {"step": 10, "time": NOW, "seconds": 0.5},
               "start": {"restartCount": 1, "rendezvousTime": NOW, "checkpointLoadedTime": NOW,
                         "checkpointLoadSeconds": 0.25, "firstStepTime": NOW},
               "lostPeers": {f"bounded-worker-{i}": {"silentSince": NOW, "reportTime": NOW, "by": "bounded-worker-0"}
                             for i in range(1, 40)}}
    accepted = patch(cluster, namespace, written)
    assert accepted.returncode == 0, accepted.stderr
    assert jobs.get("bounded")["status"]["progress"]["lostPeers"]["bounded-worker-39"]["by"] == "bounded-worker-0"
    too_big: list[tuple[dict[str, Any], str]] = [
        ({"updateTime": "2026-11-29T10:00:00." + "1" * 80 + "Z"}, "status.progress.updateTime"),
        ({"source": "x" * 33}, "status.progress.source"),
        ({"lostPeers": {"p": {"by": "x" * 254}}}, "status.progress.lostPeers.p.by"),
        ({f"extra{i}": i for i in range(32)}, "status.progress"),
    ]
    for bad, field in too_big:
        refused = patch(cluster, namespace, bad)
        assert refused.returncode != 0 and field in refused.stderr, (field, refused.stderr)
    assert jobs.get("bounded")["status"]["progress"]["updateTime"] == NOW

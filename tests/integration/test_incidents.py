"""Incidents against the real control plane (kwok nodes): one lost rendezvous store is one incident whatever the
number of workers it takes down, backoffLimit counts incidents, and failure messages stay readable.

kwok runs no containers, so the test does to the workers what their agents do when they need a store that stays
gone (a later fault while it is lost, past the join timeout): each exits 200 with torchrun's error as its
termination message. Real agents first keep their group training and reconnect to the new store
(tests/worker/test_store_loss.py; tests/e2e: the soak's store deletions, the store's node powered off)."""

from __future__ import annotations

import time

from tests.conftest import Cluster, wait_for
from tests.integration.operator_support import Jobs, OperatorProcess, small_job

STORE_LOST = ("torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store "
              "has failed. See inner exception for details. (rank 0, exit code 200)")
NATIVE = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
          "[10.244.0.7]:37043\nException raised from recvBytes at ../torch/csrc/distributed/c10d/Utils.hpp:671 "
          "(most recent call first):\nframe #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 "
          "(0x7f3b2f9a1446 in /opt/venv/lib/python3.11/site-packages/torch/lib/libc10.so)\nframe #1: "
          "<unknown function> + 0x5aa2d1 (0x55d2e1 in /opt/venv/bin/python3)")
USAGE = ("usage: torchrun [-h] [--nnodes NNODES] [--nproc-per-node NPROC_PER_NODE]\n"
         "                [--rdzv-backend RDZV_BACKEND] [--rdzv-endpoint RDZV_ENDPOINT]\n"
         "torchrun: error: argument --nnodes: invalid int value: 'x'")


def lose_the_store(cluster: Cluster, jobs: Jobs, ns: str, name: str, workers: int) -> None:
    """Delete the rendezvous pod; every agent then exits 200 (the fallback); wait for the replacements to run."""
    old = {p["metadata"]["uid"] for p in jobs.live_pods(name)}
    cluster.kubectl("delete", "pod", f"{name}-rdzv", "-n", ns, "--wait=false")
    for i in range(workers):
        jobs.fail(f"{name}-worker-{i}", 200, STORE_LOST)

    def replaced() -> bool:
        live = jobs.live_pods(name)
        return len(live) == workers and not old & {p["metadata"]["uid"] for p in live} and \
            all(p["status"].get("phase") == "Running" for p in live)

    wait_for(replaced, timeout=90, describe=f"all {workers} workers replaced and running",
             state=lambda: jobs.describe(name))
    wait_for(lambda: any(p["status"].get("phase") == "Running" for p in jobs.live_pods(name, kind="rendezvous")),
             timeout=60, describe="a new rendezvous pod running")


def test_four_workers_lose_the_store_three_times_within_backoff_limit_3_then_a_fourth_fails(
    cluster: Cluster, namespace: str, operator: OperatorProcess, jobs: Jobs
) -> None:
    jobs.apply(small_job("four", 4, runPolicy={"backoffLimit": 3}))
    jobs.running("four", 4)
    jobs.wait_condition("four", "Running")
    for n in (1, 2, 3):
        t0 = time.monotonic()
        lose_the_store(cluster, jobs, namespace, "four", 4)
        wait_for(lambda n=n: jobs.get("four")["status"].get("incidentCount") == n, timeout=30,  # type: ignore[misc]
                 describe=f"incidentCount == {n}", state=lambda: jobs.describe("four"))
        incident = jobs.get("four")["status"]["incidents"][-1]
        assert incident["cause"] == "RendezvousLost" and len(incident["pods"]) == 5, incident
        print(f"store loss {n}: 1 incident, 5 pods, all replaced in {time.monotonic() - t0:.1f}s")
    assert not jobs.condition("four", "Failed")
    for i in range(4):
        jobs.succeed(f"four-worker-{i}")
    jobs.wait_condition("four", "Succeeded", timeout=60)
    status = jobs.get("four")["status"]
    assert status["incidentCount"] == 3 and status["restarts"] == 12, status

    jobs.apply(small_job("five", 4, runPolicy={"backoffLimit": 3}))
    jobs.running("five", 4)
    for _ in range(3):
        lose_the_store(cluster, jobs, namespace, "five", 4)
    # The fourth loss is the fourth incident: the job fails at the store's deletion, before any agent exits.
    cluster.kubectl("delete", "pod", "five-rdzv", "-n", namespace, "--wait=false")
    failed = jobs.wait_condition("five", "Failed", timeout=60)
    assert failed["reason"] == "BackoffLimitExceeded", failed
    assert failed["message"].startswith("4 incidents exceed spec.runPolicy.backoffLimit (3)"), failed["message"]
    for n in (1, 2, 3, 4):
        assert f"#{n} RendezvousLost" in failed["message"], failed["message"]
    print(f"the fourth loss: {failed['message'][:300]}")


def test_failure_messages_carry_the_cause_not_frames_or_usage(cluster: Cluster, namespace: str,
                                                              operator: OperatorProcess, jobs: Jobs) -> None:
    jobs.apply(small_job("native", 2))
    jobs.running("native", 2)
    jobs.fail("native-worker-1", 201, NATIVE)
    wait_for(lambda: jobs.get("native")["status"].get("incidentCount") == 1, timeout=30, describe="an incident")
    event = wait_for(lambda: next((e for e in jobs.events("native") if e["reason"] == "WorkerFailed"), None),
                     timeout=30, describe="a WorkerFailed Event")
    assert "Connection closed by peer" in event["message"] and "0x" not in event["message"], event["message"]
    jobs.apply(small_job("usage", 1))
    jobs.running("usage", 1)
    jobs.fail("usage-worker-0", 2, USAGE)
    failed = jobs.wait_condition("usage", "Failed")
    assert "argument --nnodes: invalid int value" in failed["message"], failed["message"]
    assert "usage:" not in failed["message"] and "[-h]" not in failed["message"], failed["message"]
    # The namespace fixture then checks every Failed condition and Warning Event here (tests/readable.py).

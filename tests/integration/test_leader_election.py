"""Two `ddpjob operator --leader-elect` processes on the real control plane (issue 23 #1): one leads, the other
waits; a killed, stopped or frozen leader is replaced by the standby, every failure is handled exactly once (one
replacement pod, one restart counted), and a frozen leader that wakes up after losing the Lease exits instead of
writing. Short lease timings (4 s lease) keep the test quick; the chart's defaults are 15/10/2."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Cluster, wait_for
from tests.integration.operator_support import Jobs, OperatorProcess, small_job

LEASE, RENEW, RETRY = 4, 3, 1


@pytest.fixture
def pair(cluster: Cluster, namespace: str, ddpjob_crd: str, tmp_path: Path) -> Iterator[list[OperatorProcess]]:
    args = ("--leader-elect", "--leader-election-namespace", namespace, "--lease-duration", str(LEASE),
            "--renew-deadline", str(RENEW), "--retry-period", str(RETRY))
    ops = [OperatorProcess(cluster, namespace, tmp_path, extra_args=args, name=n) for n in ("a", "b")]
    try:
        for op in ops:
            op.start()  # a standby answers /healthz too
        yield ops
    finally:
        for op in ops:
            op.stop()


def leader_of(ops: list[OperatorProcess], timeout: float) -> tuple[OperatorProcess, float]:
    """The replica that leads (exactly one), and the seconds it took to appear."""
    t0 = time.monotonic()

    def one() -> OperatorProcess | None:
        leading = [op for op in ops if op.proc is not None and op.proc.poll() is None and op.leading()]
        assert len(leading) <= 1, "two replicas lead at once"
        return leading[0] if leading else None

    found = wait_for(one, timeout=timeout, interval=0.2, describe="a leader",
                     state=lambda: "\n".join(op.tail(15) for op in ops))
    return found, time.monotonic() - t0


def fail_and_wait_replaced(jobs: Jobs, pod: str, restarts: int) -> None:
    """Fail ``pod`` (exit 137: retryable); wait for the replacement and the restart count."""
    old = next(p["metadata"]["uid"] for p in jobs.pods("ha") if p["metadata"]["name"] == pod)
    jobs.fail(pod, 137)
    wait_for(lambda: jobs.get("ha")["status"].get("restarts") == restarts, timeout=60,
             describe=f"restarts == {restarts}", state=lambda: jobs.describe("ha"))
    wait_for(lambda: any(p["metadata"]["name"] == pod and p["metadata"]["uid"] != old
                         for p in jobs.running("ha", 2)), timeout=60, describe=f"{pod} replaced")


def test_one_leader_and_takeovers_by_kill_stop_and_freeze_handle_each_failure_once(
        cluster: Cluster, namespace: str, pair: list[OperatorProcess], jobs: Jobs, uids: PodUids) -> None:
    first, _ = leader_of(pair, timeout=30)
    standby = next(op for op in pair if op is not first)
    assert standby.healthy() and not standby.leading()
    # A standby stops at once on SIGTERM, with its own handler (in a container it is PID 1, which ignores a
    # SIGTERM it has no handler for: the kubelet's SIGKILL came 30 s later).
    t0 = time.monotonic()
    standby.stop()
    assert standby.proc is not None and standby.proc.returncode == 0, standby.tail()
    assert time.monotonic() - t0 < 5 and "stopped while waiting to lead" in standby.tail()
    standby.start()
    jobs.apply(small_job("ha", 2, runPolicy={"backoffLimit": 10}))
    jobs.running("ha", 2)
    fail_and_wait_replaced(jobs, "ha-worker-1", 1)

    # kill -9: the Lease is not released; the standby takes it once it has seen it unrenewed for the lease.
    first.kill(signal.SIGKILL)
    second, took = leader_of(pair, timeout=LEASE + 10)
    assert second is standby
    print(f"takeover after kill -9 of the leader: {took:.1f}s (lease {LEASE}s)")
    assert took <= LEASE + 2 * RETRY + 1
    fail_and_wait_replaced(jobs, "ha-worker-0", 2)

    # A clean stop (SIGTERM: a rollout or kubectl drain) releases the Lease: taken within the retry period.
    first.start()
    time.sleep(1)
    assert not first.leading()
    second.stop()
    third, took = leader_of(pair, timeout=LEASE + 10)
    assert third is first
    print(f"takeover after SIGTERM of the leader (Lease released): {took:.1f}s (retry period {RETRY}s)")
    assert took <= 2 * RETRY + 1.5
    fail_and_wait_replaced(jobs, "ha-worker-1", 3)

    # A frozen leader (SIGSTOP: a partitioned or paused node): the standby takes over, and the old leader, when it
    # wakes past its renew deadline, exits without writing.
    second.start()
    time.sleep(1)
    third.pause()
    fourth, took = leader_of([second], timeout=LEASE + 10)
    print(f"takeover from a frozen leader: {took:.1f}s")
    fail_and_wait_replaced(jobs, "ha-worker-0", 4)
    third.resume()
    assert third.proc is not None
    assert third.proc.wait(timeout=RETRY * 3 + 5) == 3, third.tail()
    assert "leadership lost" in third.tail()
    assert fourth.leading()

    # Each failure handled once: one replacement per failure, four restarts, nothing counted twice.
    time.sleep(2)
    status = jobs.get("ha")["status"]
    assert status.get("restarts") == 4 and len(status.get("incidents") or []) == 4, status
    assert len(jobs.pods("ha")) == 2
    created = uids.stop()
    print(f"worker pods created over the test: {len(created)} (2 + 4 replacements)")
    assert len(created) == 6, "a pod was created twice (or a replacement is missing)"


class PodUids:
    """Every worker pod UID the API server reports while the test runs (a kubectl watch): a pod created twice shows
    as one UID too many."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.proc = subprocess.Popen(
            ["kubectl", f"--kubeconfig={cluster.kubeconfig}", "get", "pods", "-n", namespace, "-l",
             "ddpjob.io/replica-type=worker", "-w", "-o", "custom-columns=UID:.metadata.uid", "--no-headers"],
            stdout=subprocess.PIPE, text=True)

    def stop(self) -> set[str]:
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=10)
        return {line.strip() for line in out.splitlines() if line.strip()}


@pytest.fixture
def uids(cluster: Cluster, namespace: str) -> Iterator[PodUids]:
    watch = PodUids(cluster, namespace)
    try:
        yield watch
    finally:
        if watch.proc.poll() is None:
            watch.proc.kill()
            watch.proc.wait()

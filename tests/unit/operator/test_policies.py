"""Table-driven tests of each run policy."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from ddpjob_operator.api.spec import RunPolicy
from ddpjob_operator.planner.observation import PodView
from ddpjob_operator.planner.policies import deadline, stuck, success, suspend, ttl
from ddpjob_operator.planner.policies.restart import ExitAction, backoff_exhausted, restart_policy_for_exit_code

from .factories import at

RETRY, FAIL = ExitAction.RETRY, ExitAction.FAIL


@pytest.mark.parametrize(
    ("code", "policy", "action"),
    [
        (None, {}, RETRY),  # evicted / node lost: no exit code
        (1, {}, FAIL),
        (78, {}, FAIL),  # ddp-worker's broken env contract
        (127, {}, FAIL),
        (128, {}, RETRY),
        (137, {}, RETRY),  # SIGKILL (OOM, lost node)
        (143, {}, RETRY),  # SIGTERM (preemption; the checkpoint library exits 143 after saving)
        (1, {"retryable_exit_codes": (1,)}, RETRY),
        (137, {"permanent_exit_codes": (137,)}, FAIL),
        (2, {"retryable_exit_codes": (1,)}, FAIL),  # lists only override the codes they name
    ],
)
def test_restart_policy_for_exit_code(code: int | None, policy: dict[str, tuple[int, ...]], action: ExitAction) -> None:
    assert restart_policy_for_exit_code(code, RunPolicy.model_validate(policy)) is action


@pytest.mark.parametrize(("restarts", "limit", "exhausted"), [(0, 0, False), (1, 0, True), (6, 6, False), (7, 6, True)])
def test_backoff_exhausted(restarts: int, limit: int, exhausted: bool) -> None:
    assert backoff_exhausted(restarts, RunPolicy(backoff_limit=limit)) is exhausted


def worker(i: int, phase: str, finished: datetime | None = None, **kw: Any) -> PodView:
    return PodView(name=f"w-{i}", uid=f"u{i}", replica_type="worker", index=i, phase=phase, finished_at=finished, **kw)


@pytest.mark.parametrize(
    ("phases", "now_s", "done"),
    [
        (["Running", "Running"], 0, False),
        (["Succeeded", "Succeeded"], 0, True),
        (["Succeeded", "Running"], 30, False),  # straggler within closeTimeoutSeconds
        (["Succeeded", "Running"], 61, True),  # ... and after it
        (["Succeeded", "Failed"], 0, True),
        (["Failed", "Running"], 100, False),
    ],
)
def test_success_rule(phases: list[str], now_s: float, done: bool) -> None:
    workers = [worker(i, p, at(0) if p != "Running" else None) for i, p in enumerate(phases)]
    assert success.job_succeeded(workers, 60, at(now_s)) is done


@pytest.mark.parametrize(
    ("completed", "ttl_s", "now_s", "expired"),
    [(None, 10, 100, False), (0, None, 100, False), (0, 10, 5, False), (0, 10, 10, True), (0, 0, 0, True)],
)
def test_ttl(completed: float | None, ttl_s: int | None, now_s: float, expired: bool) -> None:
    done = at(completed) if completed is not None else None
    assert ttl.ttl_expired(done, ttl_s, at(now_s)) is expired


@pytest.mark.parametrize(
    ("start", "limit", "now_s", "exceeded"),
    [(None, 10, 100, False), (0, None, 100, False), (0, 10, 9, False), (0, 10, 10, True)],
)
def test_deadline(start: float | None, limit: int | None, now_s: float, exceeded: bool) -> None:
    started = at(start) if start is not None else None
    assert deadline.deadline_exceeded(started, limit, at(now_s)) is exceeded


@pytest.mark.parametrize(
    ("deleting_s", "grace", "node", "ready", "now_s", "is_stuck"),
    [
        (None, 0, "n1", False, 1000, False),  # not Terminating
        (0, 0, "n1", True, 1000, False),  # node Ready: the kubelet will finish it
        (0, 0, "n1", False, 299, False),  # not long enough
        (0, 0, "n1", False, 300, True),
        (0, 0, "gone", None, 300, True),  # node deleted
        (0, 0, None, None, 1000, False),  # never scheduled: deletion is immediate anyway
        # deletionTimestamp is the request plus the grace period: the timeout runs from the request
        (45, 45, "n1", False, 299, False),
        (45, 45, "n1", False, 300, True),
    ],
)
def test_stuck_terminating(
    deleting_s: float | None, grace: int, node: str | None, ready: bool | None, now_s: float, is_stuck: bool
) -> None:
    pod = worker(0, "Running", deletion_timestamp=at(deleting_s) if deleting_s is not None else None, node_name=node,
                 deletion_grace_seconds=grace)
    nodes = {"n1": bool(ready)} if ready is not None else {}
    assert stuck.is_stuck_terminating(pod, nodes, 300, at(now_s)) is is_stuck
    if deleting_s is not None:
        assert stuck.stuck_check_at(pod, 300) == at(deleting_s - grace + 300)


def test_suspend_resets_start_time() -> None:
    assert suspend.start_time_after_resume(True, "t0", "t1") is None
    assert suspend.start_time_after_resume(False, None, "t1") == "t1"
    assert suspend.start_time_after_resume(False, "t0", "t1") == "t0"

"""Restart policy: does a worker's exit code replace the pod, or fail the whole job?"""

from __future__ import annotations

import enum

from ddpjob_operator.api.spec import RunPolicy


class ExitAction(enum.Enum):
    """What to do with a failed worker pod."""

    RETRY = "Retry"
    """Replace the pod (counts towards backoffLimit)."""
    FAIL = "Fail"
    """Fail the job at once: restarting cannot help."""


def restart_policy_for_exit_code(code: int | None, policy: RunPolicy) -> ExitAction:
    """Classify an exit code: explicit lists first, then the default (1..127 permanent, >=128 retryable).

    ``None`` means the pod failed without a container exit code (evicted, node lost, preempted): the
    program never said it was broken, so it is retried.
    """
    if code is None:
        return ExitAction.RETRY
    if policy.retryable_exit_codes is not None and code in policy.retryable_exit_codes:
        return ExitAction.RETRY
    if policy.permanent_exit_codes is not None and code in policy.permanent_exit_codes:
        return ExitAction.FAIL
    # Codes >= 128 are 128+signal: the process was killed (SIGKILL by the OOM killer or a lost node,
    # SIGTERM on preemption), which says nothing about the program itself.
    return ExitAction.RETRY if code >= 128 else ExitAction.FAIL


def backoff_exhausted(restarts: int, policy: RunPolicy) -> bool:
    """True when the job has used more replacements than backoffLimit allows (0 means: never replace)."""
    return restarts > policy.backoff_limit

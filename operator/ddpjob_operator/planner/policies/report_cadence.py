"""How often each running job's rank 0 may send a routine progress report (issue 46): a write budget for all the
operator's running jobs together. Each report is a write of the whole DDPJob into etcd and a watch event to every
watcher; at the worker's own 10 s, 1,000 running jobs write 100 times a second, which a small API server cannot
serve (on this project's 2-core machine one served ~40 a second and timed the rest out: docs/operator-scale.md).
The operator writes the cadence into ``status.reportIntervalSeconds`` and the worker runtime reads it from the answer
to each of its reports (ddpjob_worker.progress); absent, the worker keeps its own 10 s. Forced reports (after a
checkpoint, a new process group's start, the script's finish) do not wait for it, and the stall deadlines
(minutes) are far longer than the longest cadence."""

from __future__ import annotations

#: The worker runtime's own interval (ddpjob_worker.progress.ProgressReporter, autoprogress.INTERVAL_SECONDS).
BASE_SECONDS = 10
#: The longest cadence: a step shows in `kubectl get ddpj` within this long, whatever the number of jobs.
MAX_SECONDS = 320
#: Routine progress writes per second for all running jobs together (`ddpjob operator --report-writes-per-second`).
DEFAULT_BUDGET = 50.0


def interval(running_jobs: int, budget: float = DEFAULT_BUDGET) -> int | None:
    """The cadence for ``running_jobs`` within ``budget``: the base 10 s, doubled until the jobs fit (doubling, so
    the cadence changes, and every job's status with it, only when the number of jobs doubles), at most 320 s.

    Args:
        running_jobs: The operator's jobs that report, or will once their pods run (Created, Running,
            Restarting: runtime/controller.report_interval).
        budget: Routine writes per second allowed for all of them; 0 or less: no budget.

    Returns:
        The seconds, or None when the worker's own 10 s fit (the status then says nothing).
    """
    seconds = BASE_SECONDS
    while budget > 0 and running_jobs / seconds > budget and seconds < MAX_SECONDS:
        seconds *= 2
    return None if seconds == BASE_SECONDS else seconds


def for_job(cadence: int | None, progress_deadline_seconds: int) -> int | None:
    """A job's cadence: at most an eighth of its ``progressDeadlineSeconds``, so a stall check never waits on a
    report the budget held back, even from a reporter that backs off (ddpjob_worker.progress.MAX_BACKOFF, 4 times:
    half the deadline). A job with a deadline of 120 s keeps reporting every 15 s.

    Args:
        cadence: ``interval``'s answer for all running jobs.
        progress_deadline_seconds: The job's spec.runPolicy.progressDeadlineSeconds (0: no stall check).

    Returns:
        The seconds, or None for the worker's own 10 s.
    """
    if cadence is None or progress_deadline_seconds <= 0:
        return cadence
    seconds = min(cadence, progress_deadline_seconds // 8)
    return seconds if seconds > BASE_SECONDS else None

"""When to write the status: now, or a little later together with what comes next.

A pass that changes the job's state, a condition's status or reason, an incident, a count of restarts or anything
else the next decisions rest on writes it at once (``countedFailures`` must be stored before the pods it counts
are acted on). A change of pod counts and condition messages alone (pods appearing, being scheduled and starting
one by one, ``ready: 2/4``) is routine: it waits ``wait`` seconds from the pass that first found it, and the pass
then writes the status as it is by that time, or an earlier non-routine write takes it along. Pods of a 4-worker
job start over seconds; writing each step cost ~4.6 status patches per job before it ran (500 jobs: 2,287
patches, each one echoed back through the watch). Kubernetes' Job controller batches pod updates the same way
(syncJobBatchPeriod, 1 s)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from ddpjob_worker.contract import STATUS_REPORT_INTERVAL

#: Status keys that follow pod counts (and the report cadence, policies/report_cadence.py); changes to these alone
#: (and to condition messages) are routine.
COUNT_KEYS = frozenset({"replicas", "readyReplicas", "succeededReplicas", "failedReplicas", "ready", "spares",
                        STATUS_REPORT_INTERVAL})
#: Seconds a routine change may wait for the next one on an idle operator; `kubectl get ddpj`'s READY lags at
#: most this long.
ROUTINE_INTERVAL = 2.0
#: The longest a routine change waits while the operator is busy.
BUSY_INTERVAL = 30.0


def interval(queued: int, workers: int) -> float:
    """How long routine changes wait: ``ROUTINE_INTERVAL``, stretched while more jobs wait for a pass than the
    workers take at once. A burst of new jobs (500 at once) then spends the API server on their pods, not on
    `ready: 1/4` of the jobs already started (each write also costs every watcher of DDPJobs a copy)."""
    return min(BUSY_INTERVAL, ROUTINE_INTERVAL * max(1.0, queued / max(1, workers)))


@dataclasses.dataclass(frozen=True, slots=True)
class Write:
    """This pass's status write: now, or not before ``later`` (then the job needs a pass at that time). Neither:
    nothing to write."""

    now: bool
    later: datetime | None = None


def _condition_states(status: Mapping[str, Any]) -> set[tuple[Any, Any, Any]]:
    return {(c.get("type"), c.get("status"), c.get("reason")) for c in status.get("conditions") or []}


def routine(patch: Mapping[str, Any], old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """True when the patch changes only pod counts and condition messages: no condition appears, disappears or
    changes status or reason."""
    if not patch:
        return False
    if any(key not in COUNT_KEYS and key != "conditions" for key in patch):
        return False
    return "conditions" not in patch or _condition_states(old) == _condition_states(new)


def decide(
    patch: Mapping[str, Any],
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    pending_since: datetime | None,
    now: datetime,
    wait: float = ROUTINE_INTERVAL,
) -> Write:
    """Write now, unless the change is routine and has not waited ``wait`` seconds since ``pending_since`` (the pass
    that first deferred a routine change; None: this pass is the first)."""
    if not patch:
        return Write(now=False)
    if not routine(patch, old, new):
        return Write(now=True)
    due = (pending_since or now) + timedelta(seconds=wait)
    return Write(now=True) if now >= due else Write(now=False, later=due)

"""Whether a new version of a DDPJob needs a reconcile pass when rank 0's routine progress report is all that changed
(issue 46). Every running job's rank 0 patches ``status.progress`` about every 10 s: at 1,000 running jobs that is
~100 watch events a second, and a pass for each cost the operator most of a core on a 2-core machine
(docs/operator-scale.md, "The steady state") while it planned nothing new: a running job's plan reads from a new
step only the stall clock, and the stall check's timer (requeue_after) passes the job again when its deadline is due
and then reads the newest report.

A pass is skipped only when nothing but the routine fields of ``status.progress`` changed, the report is not the
first, and the job is Running with no open incident and no Stalled condition. Everything else keeps its pass: a new
process group (``progress.start``), the script's return (``finishTime``), peers reported lost, the first report, a
stall to clear, an incident whose recovery waits on a step. Pure: the controller asks it for each watch event.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddpjob_operator.api import reasons
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.policies import incidents

#: The fields of ``status.progress`` a step or a checkpoint changes (ddpjob_worker.progress.ProgressReporter): what
#: the stall clock reads of them is read again at its deadline.
ROUTINE_KEYS = frozenset({"epoch", "step", "globalStep", "totalSteps", "loss", "lastCheckpoint", "updateTime",
                          "lastStepTime", "stepRate", "source"})
#: Metadata that changes with every write and means nothing to the plan.
_VOLATILE_METADATA = frozenset({"resourceVersion", "managedFields"})


def needs_pass(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether ``new`` (a watch event's body) can change the plan made from ``old`` (the body the last pass had).

    Args:
        old: The DDPJob as last planned.
        new: Its newer version.

    Returns:
        False only for a routine progress report of a quiet running job (see the module's docstring).
    """
    old_status, new_status = old.get("status") or {}, new.get("status") or {}
    old_progress, new_progress = old_status.get("progress") or {}, new_status.get("progress") or {}
    if not old_progress or not _quiet(old_status):
        return True
    changed = {k for k in old_progress.keys() | new_progress.keys() if old_progress.get(k) != new_progress.get(k)}
    return not changed <= ROUTINE_KEYS or not _same_but_progress(old, new)


def _same_but_progress(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Equal but for status.progress and the metadata every write changes."""

    def meta(body: Mapping[str, Any]) -> dict[str, Any]:
        return _without(body.get("metadata") or {}, *_VOLATILE_METADATA)

    return (_without(old.get("status") or {}, "progress") == _without(new.get("status") or {}, "progress")
            and old.get("spec") == new.get("spec") and meta(old) == meta(new)
            and _without(old, "status", "metadata", "spec") == _without(new, "status", "metadata", "spec"))


def _quiet(status: Mapping[str, Any]) -> bool:
    """Running, no incident recovering, no Stalled condition True."""
    if status.get("state") != st.RUNNING or incidents.recovering(status.get("incidents") or []) is not None:
        return False
    return not any(c.get("type") == reasons.STALLED and c.get("status") == "True"
                   for c in status.get("conditions") or [])


def _without(obj: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in keys}

"""Invalid edits: what a spec the operator cannot run does to a job that already runs.

The pod template and most of the run policy stay mutable, and what the schema cannot check (the template is
free-form) is checked here, after the API server stored the edit. A job whose spec was invalid from the start
never had a pod: it fails at once (``InvalidSpec``), nothing lost. A job that already runs is not failed for an
edit: that would leave its pods running under a job that says Failed (and cleanPodPolicy would end hours of
training for a typo). It goes on with the last spec this operator process accepted, and the ``SpecRejected``
condition names the field and the fix until the spec is valid again. An operator that restarted since has no such
spec: it then holds the job as it is (no pod created or deleted) under the same condition. Pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from ddpjob_operator.api import reasons
from ddpjob_operator.api.formats import truncate
from ddpjob_operator.api.spec import DDPJob, InvalidSpec, parse_ddpjob
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.observation import PodView


@dataclasses.dataclass(frozen=True)
class Edit:
    """``fail``: never started, Failed/InvalidSpec; ``keep``: run ``job`` (the last valid spec); ``hold``: leave the
    job's pods and state as they are; ``ended``: the job already Succeeded or Failed, its status stays as it is."""

    action: Literal["fail", "keep", "hold", "ended"]
    job: DDPJob | None = None


def decide(body: Mapping[str, Any], old: Mapping[str, Any], pods: Sequence[PodView],
           last_valid: Mapping[str, Any] | None) -> Edit:
    """What an invalid ``body`` does, given the job's status, its pods and the last spec accepted for it."""
    uid = (body.get("metadata") or {}).get("uid")
    started = bool(old.get("startTime")) or any(p.owner_uid == uid and not p.gone for p in pods)
    if st.condition_true(old, st.SUCCEEDED) or st.condition_true(old, st.FAILED):
        return Edit("ended")  # an ended job keeps its outcome (an invalid one its InvalidSpec)
    if not started:
        return Edit("fail")
    if last_valid is not None:
        try:
            return Edit("keep", parse_ddpjob({**body, "spec": last_valid}))
        except InvalidSpec:
            pass  # a spec accepted by an older operator version: nothing safe to run
    return Edit("hold")


def condition(err: InvalidSpec | None, edit: Edit | None) -> st.Aux:
    """The ``SpecRejected`` condition of this pass (False once the spec is valid again)."""
    if err is None or edit is None:
        return st.Aux(st.SPEC_REJECTED, False, reasons.SPEC_ACCEPTED, "the current spec is valid")
    goes_on = ("the job goes on with the last valid spec" if edit.action == "keep" else
               "the operator holds the job as it is (no pod created or deleted)")
    return st.Aux(st.SPEC_REJECTED, True, reasons.INVALID_SPEC,
                  truncate(f"{err}; {goes_on} until the spec is fixed or the edit reverted"))

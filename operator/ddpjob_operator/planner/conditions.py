"""The conditions beside a job's state (Stalled, ChildConflict, CreateRefused, Queued, PodsCannotStart): each says
what blocks or threatens the job while it lasts. Pure: the planner's view of the job in, the conditions out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ddpjob_operator.api import reasons
from ddpjob_operator.api.formats import truncate
from ddpjob_operator.planner import status as st
from ddpjob_operator.planner.observation import PodView
from ddpjob_operator.planner.policies import cannot_start, children, incidents, stall, unschedulable
from ddpjob_operator.planner.policies.children import ChildKey, Problem


def aux_conditions(recent: Sequence[Mapping[str, Any]], verdict: stall.Verdict | None, conflicts: Sequence[str],
                   problems: Mapping[ChildKey, Problem], pods: Sequence[PodView], *, gang: bool) -> list[st.Aux]:
    """The auxiliary conditions of this pass, from the recent incidents, the stall check (None: the job does not
    run), the conflicting children, the API server's answers to the last creates and the job's pods."""
    out: list[st.Aux] = []
    last = incidents.recovering(recent)
    if verdict is not None and verdict.stall is not None:
        out.append(st.Aux(st.STALLED, True, verdict.stall.reason, verdict.stall.message))
    elif last is not None and last.get("cause") == reasons.STALLED:
        out.append(st.Aux(st.STALLED, True, reasons.RESTARTED_AFTER_STALL,
                          f"incident #{last.get('id')}: workers restarted after a stall; waiting for a step"))
    elif verdict is None:
        out.append(st.Aux(st.STALLED, False, reasons.NOT_RUNNING, "the job runs no pods"))
    else:  # shown from the start: which clock runs, and until when (or that the runtime cannot see the steps)
        out.append(st.Aux(st.STALLED, False, verdict.reason, verdict.message, show=True))
    if conflicts:
        out.append(st.Aux(st.CHILD_CONFLICT, True, reasons.CHILD_CONFLICT, truncate("; ".join(conflicts))))
    else:
        out.append(st.Aux(st.CHILD_CONFLICT, False, reasons.NO_CONFLICT, "every child is controlled by this DDPJob"))
    refused = children.refusals(problems)
    if refused:
        first = refused[0]
        text = f"the API server refused to create {first.kind} {first.name}: {first.message}; retrying with backoff"
        out.append(st.Aux(st.CREATE_REFUSED, True, first.reason, truncate(text)))
    else:
        out.append(st.Aux(st.CREATE_REFUSED, False, reasons.CREATED, "the API server accepted every create"))
    q = unschedulable.decide(pods, gang=gang)
    out.append(st.Aux(st.QUEUED, q.queued, q.reason, q.message))
    c = cannot_start.decide(pods)
    out.append(st.Aux(st.CANNOT_START, c.blocked, c.reason, c.message))
    return out


#: The auxiliary conditions a finished job's status says are over (SpecRejected stays: it is about the spec).
FINISHED_TYPES = (st.STALLED, st.QUEUED, st.CHILD_CONFLICT, st.CREATE_REFUSED, st.CANNOT_START)


def finished_conditions(state: str) -> list[st.Aux]:
    """A finished job's auxiliary conditions: False, saying it finished. Its last running pass's words (a stall
    clock's "allowed until", a scheduler's Unschedulable) would no longer be true. Conditions it never had stay
    absent."""
    message = f"the job finished ({state}): nothing holds or threatens it any more"
    return [st.Aux(ctype, False, reasons.JOB_FINISHED, message) for ctype in FINISHED_TYPES]

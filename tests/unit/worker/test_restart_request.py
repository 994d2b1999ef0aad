"""Restart requests (ddpjob_worker.restart_request): the annotation's text, read back from the projected file."""

from __future__ import annotations

from pathlib import Path

import pytest
from ddpjob_worker.restart_request import Request, due, parse, read, seen

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("text", "want"), [
    ("3@1764190000.250", Request(3, 1764190000.25)),
    (" 3@1764190000\n", Request(3, 1764190000.0)),
    ("", None),  # no annotation: the kubelet projects an empty file
    ("3", None), ("x@1", None), ("3@soon", None),  # hand-edited: ignored, never an error
])
def test_parse(text: str, want: Request | None) -> None:
    assert parse(text) == want


def test_text_round_trips() -> None:
    request = Request(12, 1764190000.125)
    assert parse(request.text()) == request


@pytest.mark.parametrize(("content", "known", "want"), [
    ("3@200.000", None, Request(3, 200.0)),  # nothing known: act on it
    ("3@200.000", 2, Request(3, 200.0)),  # a newer incident than the last one known
    ("3@200.000", 3, None),  # answered, or there when the group formed: done
    ("3@200.000", 4, None),  # hand-edited back to an older one: ignored
    (None, None, None),  # no file
    ("", 2, None),
])
def test_due(tmp_path: Path, content: str | None, known: int | None, want: Request | None) -> None:
    path = tmp_path / "request"
    if content is not None:
        path.write_text(content)
    assert due(str(path), known) == want
    assert due("", known) is None  # the operator set no file (ddpjob run)
    assert read(str(tmp_path / "missing")) is None


#: Seconds the operator's clock (the request's time) is off the worker's (its group's formation).
SKEWS = [-600.0, -60.0, 0.0, 60.0, 600.0]


@pytest.mark.parametrize("skew", SKEWS, ids=[f"operator {s:+.0f}s" for s in SKEWS])
def test_one_agents_requests_over_time_whatever_the_clocks(tmp_path: Path, skew: float) -> None:
    """What an agent does (agent.py): ``seen`` when its group forms, ``due`` about once a second, and the answered
    incident kept. Each request is obeyed exactly once, and one already there when a group formed never: behind the
    worker's clock a request was ignored (its pods replaced 120 s later); ahead of it, obeyed at every new group."""
    path = tmp_path / "request"
    now = 1_800_000_000.0  # the worker's clock

    def agent_formed(known: int | None) -> int | None:
        return seen(str(path), known)

    known = agent_formed(None)  # first group: no file yet
    assert due(str(path), known) is None
    path.write_text(Request(3, now + 5 + skew).text())  # the group stalls: incident 3
    request = due(str(path), known)
    assert request is not None and request.incident == 3
    known = request.incident  # answered: the trainers stop, the group re-forms
    known = agent_formed(known)
    assert due(str(path), known) is None, "obeyed once"
    path.write_text(Request(5, now + 100 + skew).text())  # a later stall: incident 5
    assert due(str(path), known) == Request(5, now + 100 + skew)
    # A pod created later (or a group formed for another reason) finds the request there when its group forms.
    assert due(str(path), agent_formed(None)) is None

"""Restart requests (ddpjob_worker.restart_request): the annotation's text, read back from the projected file."""

from __future__ import annotations

from pathlib import Path

import pytest
from ddpjob_worker.restart_request import Request, due, parse, read

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


@pytest.mark.parametrize(("content", "formed", "want"), [
    ("3@200.000", 100.0, Request(3, 200.0)),  # made after the group formed: act on it
    ("3@200.000", 200.0, None),  # not after it
    ("3@200.000", 300.0, None),  # a group formed since (this pod's restart, or a new pod): done
    ("3@200.000", None, None),  # no group yet
    (None, 100.0, None),  # no file
    ("", 100.0, None),
])
def test_due(tmp_path: Path, content: str | None, formed: float | None, want: Request | None) -> None:
    path = tmp_path / "request"
    if content is not None:
        path.write_text(content)
    assert due(str(path), formed) == want
    assert due("", formed) is None  # the operator set no file (ddpjob run)
    assert read(str(tmp_path / "missing")) is None

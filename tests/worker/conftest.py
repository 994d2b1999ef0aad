"""Fixtures for the torchrun tests."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.worker.helpers import LocalJob

#: Characters kept from the end of each process's log in a failure report.
LOG_TAIL = 8000


@pytest.fixture
def job(tmp_path: Path) -> Iterator[LocalJob]:
    """A rendezvous store on a free port; every process started through it is killed afterwards."""
    c = LocalJob(tmp_path)
    try:
        yield c
    finally:
        c.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, None, None]:
    """A failed test's report carries the tail of every agent's and trainer's log: CI keeps nothing but its output,
    and a flaky failure cannot be diagnosed after the fact without what the processes said."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    job = getattr(item, "funcargs", {}).get("job")
    if report.when != "call" or not report.failed or not isinstance(job, LocalJob):
        return
    for log in sorted((job.workdir / "logs").glob("*.log")):
        text = log.read_text(errors="replace")
        cut = f"[... {len(text) - LOG_TAIL} characters left out]\n" if len(text) > LOG_TAIL else ""
        report.sections.append((f"log {log.name}", cut + text[-LOG_TAIL:]))

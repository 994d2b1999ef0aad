"""Fixtures for the torchrun tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.worker.helpers import LocalJob


@pytest.fixture
def job(tmp_path: Path) -> Iterator[LocalJob]:
    """A rendezvous store on a free port; every process started through it is killed afterwards."""
    c = LocalJob(tmp_path)
    try:
        yield c
    finally:
        c.close()

"""Fixtures shared by the worker's unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ddpjob_worker.storeserver import StoreServer


@pytest.fixture
def server() -> Iterator[StoreServer]:
    """The pure-Python TCPStore server on a free port of this machine, closed after the test."""
    s = StoreServer("127.0.0.1", 0).start()
    try:
        yield s
    finally:
        s.close()

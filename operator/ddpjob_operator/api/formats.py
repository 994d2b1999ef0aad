"""The formats the API speaks that every layer reads and writes: RFC 3339 times as the API server accepts and
writes them, integers carried as label text, and messages cut to what a condition or an Event should hold."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

#: Longest termination message copied into a condition or Event (the kubelet caps it at 4 KiB anyway;
#: a condition is read by people, and Events are truncated at 1 KiB by the API server).
MAX_MESSAGE = 1000


#: An RFC 3339 date-time in any form the API server's ``format: date-time`` accepts (checked against kube-apiserver
#: 1.34: ``T`` or ``t``, any one character before a fraction of any length, ``Z``/``z`` or an offset, anything after
#: a second ``t``), and a space for the ``T`` or no zone (UTC) besides. An offset of 24 hours or more passes the API
#: server and no clock reads it.
_DATE_TIME = re.compile(r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:.(\d+))?([Zz]|[+-]\d{2}:\d{2})?"
                        r"(?:[Tt].*)?", re.DOTALL)


def parse_time(value: object) -> datetime | None:
    """A timestamp (``2024-01-02T03:04:05Z``) read leniently, or None when it is absent or cannot be read (never an
    error: workers write some of the status, and a value the API server accepted must not stop a pass)."""
    if not isinstance(value, str) or not value:
        return None
    found = _DATE_TIME.fullmatch(value.strip())
    if found is None:
        return None
    year, month, day, hour, minute, second = (int(found[i]) for i in range(1, 7))
    micros = int((found[7] or "0")[:6].ljust(6, "0"))
    zone = (found[8] or "Z").upper()
    try:
        offset = UTC if zone == "Z" else timezone(
            (-1 if zone[0] == "-" else 1) * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6])))
        # A leap second (:60) is the last second of its minute here, as Go's time package reads it.
        return datetime(year, month, day, hour, minute, min(second, 59), micros, tzinfo=offset)
    except ValueError:  # 2026-02-31, an hour 24, an offset of 24 hours or more
        return None


def format_time(value: datetime) -> str:
    """Format a timestamp the way the API server does (UTC, seconds, ``Z``)."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def count(value: Any) -> int:
    """A non-negative integer a label carries as text (generation labels); 0 when it is missing or not a number.
    Never a resourceVersion: those are opaque."""
    text = str(value or "0")
    return int(text) if text.isdigit() else 0


def truncate(text: str, limit: int = MAX_MESSAGE) -> str:
    """Cut a message to ``limit`` characters, keeping its end (where tracebacks say what went wrong)."""
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-(limit - 3) :]

"""Times in ``status.progress`` the operator cannot read. Rank 0 writes them (any worker may), and the API server's
``format: date-time`` lets through values no clock reads (an offset of 24 hours or more: ``...T00:00:00+99:00``): such a
value is ignored like an absent one (api/formats.parse_time reads every other form leniently and never fails), and
said once per job, by an Event and a log line, not on every pass."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddpjob_operator.api.formats import parse_time, truncate

#: The date-times of status.progress (the CRD's ``format: date-time`` fields), by their path under it.
TIMES = ("lastStepTime", "updateTime", "finishTime", "lastCheckpoint.time", "start.rendezvousTime",
         "start.checkpointLoadedTime", "start.firstStepTime")
#: Those of each entry of status.progress.lostPeers.
PEER_TIMES = ("silentSince", "reportTime")


def _at(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, Mapping) else None
    return obj


def times(progress: Any) -> dict[str, str]:
    """Every time in ``progress`` that is set but cannot be read, by its path (``status.progress.lastStepTime``)."""
    found = {f"status.progress.{p}": _at(progress, p) for p in TIMES}
    peers = _at(progress, "lostPeers")
    for pod, entry in (peers.items() if isinstance(peers, Mapping) else ()):
        found |= {f"status.progress.lostPeers.{pod}.{p}": _at(entry, p) for p in PEER_TIMES}
    return {path: str(value) for path, value in found.items() if value not in (None, "") and parse_time(value) is None}


def message(unread: Mapping[str, str]) -> str:
    """The Event's text for newly found unreadable times."""
    listed = "; ".join(f"{path}={value!r}" for path, value in sorted(unread.items()))
    return truncate(f"ignored, not a time the operator can read (RFC 3339, e.g. 2026-01-02T03:04:05.678Z): {listed}; "
                    "rank 0's progress reports write these (ddpjob_worker.progress): a runtime or a script that "
                    "writes the status itself must write RFC 3339 times")

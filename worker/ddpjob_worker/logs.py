"""Rank-tagged logging for everything that runs in a worker pod, so interleaved logs of many processes read apart."""

from __future__ import annotations

import logging
import os
import sys


class _RankTag(logging.Filter):
    """Adds ``tag`` (job, worker index, rank/world) to every record; read at emit time because torchrun sets
    RANK only in the worker processes it starts."""

    def filter(self, record: logging.LogRecord) -> bool:
        job = os.environ.get("DDPJOB_NAME", "-")
        index = os.environ.get("DDPJOB_WORKER_INDEX", "-")
        rank = os.environ.get("RANK")
        who = f"rank={rank}/{os.environ.get('WORLD_SIZE', '?')}" if rank is not None else "agent"
        record.tag = f"job={job} worker={index} {who}"
        return True


def get_logger(name: str) -> logging.Logger:
    """A logger under ``ddpjob`` that writes one rank-tagged line per event to stderr."""
    root = logging.getLogger("ddpjob")
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.addFilter(_RankTag())
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s [ddpjob %(tag)s] %(name)s: %(message)s"))
        root.addHandler(handler)
        root.setLevel(os.environ.get("DDPJOB_LOG_LEVEL", "INFO").upper())
        root.propagate = False
    return logging.getLogger(f"ddpjob.{name}")

"""The container's termination message: one line with the root cause of a failure, which the kubelet copies into
the pod's status (``terminationMessagePath``) so the operator's Events say what went wrong."""

from __future__ import annotations

import os
from collections.abc import Mapping

from ddpjob_worker import contract
from ddpjob_worker.logs import get_logger
from ddpjob_worker.redact import redact

log = get_logger("termlog")
#: The kubelet reads at most 4096 bytes of a termination message.
_MAX_BYTES = 4096


def termination_log_path(environ: Mapping[str, str] | None = None) -> str | None:
    """DDPJOB_TERMINATION_LOG, else the kubelet's default path when it exists (outside a pod: None)."""
    env = os.environ if environ is None else environ
    path = env.get(contract.DDPJOB_TERMINATION_LOG, "").strip()
    if path:
        return path
    return contract.DEFAULT_TERMINATION_LOG if os.path.exists(contract.DEFAULT_TERMINATION_LOG) else None


def write_termination_log(line: str, environ: Mapping[str, str] | None = None) -> None:
    """Replace the termination message with ``line``; never raises (the exit code must still come through)."""
    path = termination_log_path(environ)
    if path is None:
        return
    # Redacted: the operator copies this line into the DDPJob's status and Events (redact.py).
    data = (" ".join(redact(line).split()) + "\n").encode("utf-8", errors="replace")[:_MAX_BYTES]
    try:
        with open(path, "wb") as f:
            f.write(data)
    except OSError as err:
        log.warning("cannot write the termination message to %s: %s", path, err)

"""Restarts in place: how the operator asks the agents of a stalled group to restart their trainers, keeping the pods
(and the checkpoints on their emptyDirs). Torch-free: the operator and the worker runtime both import it.

The operator writes the pod annotation RESTART_ANNOTATION (``<incident id>@<Unix time of the request>``); the
downward API projects it into REQUEST_FILE in the worker container (the kubelet rewrites the file when the
annotation changes: a pod update makes it re-sync the pod's volumes). The agent reads the file while it monitors
its trainers and restarts them for a request of an incident it has not seen yet: the file's request when its group
formed is one that group formed after (a pod created later, a group re-formed for another reason: it was not the
one that stalled), and a request it answered is answered. Incident ids are compared, never the request's time with
the group's: those are two machines' clocks (the operator's, the worker's), and a worker behind restarted its group
again and again, one ahead ignored the request until the operator replaced every pod.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

#: Pod annotation the operator writes on every worker of a stalled group.
RESTART_ANNOTATION = "ddpjob.io/restart-request"
#: The downward-API volume that projects it, and where the worker container mounts it.
RESTART_VOLUME = "ddpjob-restart"
RESTART_MOUNT_PATH = "/etc/ddpjob/restart"
#: The file's name in that volume.
REQUEST_FILE_NAME = "request"
#: Env var naming the file (set by the operator; unset, e.g. under ``ddpjob run``, turns the feature off).
DDPJOB_RESTART_REQUEST_FILE = "DDPJOB_RESTART_REQUEST_FILE"
REQUEST_FILE = f"{RESTART_MOUNT_PATH}/{REQUEST_FILE_NAME}"


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """A restart request: the incident it belongs to and when the operator made it (Unix seconds, the operator's
    clock: for people reading the annotation, never compared with a worker's)."""

    incident: int
    at: float

    def text(self) -> str:
        """The annotation's value."""
        return f"{self.incident}@{self.at:.3f}"


def parse(text: str) -> Request | None:
    """The request in an annotation's value, or None for an empty or malformed one (never an error: a hand-edited
    annotation must not take a training agent down)."""
    incident, sep, at = text.strip().partition("@")
    if not sep:
        return None
    try:
        return Request(int(incident), float(at))
    except ValueError:
        return None


def read(path: str) -> Request | None:
    """The request in the projected file, or None when there is none (no file, no annotation yet)."""
    try:
        with open(path, encoding="utf-8") as f:
            return parse(f.read(200))
    except OSError:
        return None


def seen(path: str, known: int | None) -> int | None:
    """The newest incident this agent knows a request of: ``known``, or the one in the file now if newer. Called when
    a group forms: a request already there is one the group formed after."""
    request = read(path) if path else None
    if request is None or (known is not None and request.incident <= known):
        return known
    return request.incident


def due(path: str, known: int | None) -> Request | None:
    """The request this agent must act on: one of an incident newer than ``known`` (what :func:`seen` kept, or the
    last request it answered), or None."""
    request = read(path) if path else None
    if request is None or (known is not None and request.incident <= known):
        return None
    return request


def request_file(environ: Mapping[str, str]) -> str:
    """The request file of this pod ("" when the operator set none)."""
    return environ.get(DDPJOB_RESTART_REQUEST_FILE, "")

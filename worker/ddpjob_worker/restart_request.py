"""Restarts in place: how the operator asks the agents of a stalled group to restart their trainers, keeping the pods
(and the checkpoints on their emptyDirs). Torch-free: the operator and the worker runtime both import it.

The operator writes the pod annotation RESTART_ANNOTATION (``<incident id>@<Unix time of the request>``); the
downward API projects it into REQUEST_FILE in the worker container (the kubelet rewrites the file when the
annotation changes: a pod update makes it re-sync the pod's volumes). The agent reads the file while it monitors
its trainers and restarts them when the request is newer than its group's rendezvous: a group formed after the
request (a pod created later, a group re-formed for another reason) was not the one that stalled.
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
    """A restart request: the incident it belongs to and when the operator made it (Unix seconds)."""

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


def due(path: str, group_formed: float | None) -> Request | None:
    """The request this agent must act on: one made after its current group formed (``group_formed``, Unix time),
    or None."""
    request = read(path) if path else None
    if request is None or group_formed is None or request.at <= group_formed:
        return None
    return request


def request_file(environ: Mapping[str, str]) -> str:
    """The request file of this pod ("" when the operator set none)."""
    return environ.get(DDPJOB_RESTART_REQUEST_FILE, "")

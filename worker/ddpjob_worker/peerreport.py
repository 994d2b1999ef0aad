"""Tell the operator which peers this agent removed from its round as silent, so it replaces them at once.

Without this the operator learns of a powered-off or cut-off node from Kubernetes: the node NotReady after
15-40 s, the pod evicted after its toleration, force-deleted after terminatingNodeTimeoutSeconds; a job without
a spare waits all that time for a replacement (32 s to the replacement's start in the e2e run of 2026-11-27). The
survivors know within peerTimeoutSeconds (ddpjob_worker.membership). The agent that removed the peer writes
``status.progress.lostPeers.<pod>`` (a JSON merge patch, so each pod's entry stands alone): the pod's UID, when it
fell silent, when this was reported, and by whom. The worker account may write status.progress only (the chart's
admission policy); the operator counts the loss (cause NodeLost) and replaces the pod of that UID
(policies/silent.py), never one of the same name started since.

The UID travels in the rendezvous itself: each agent names its node by its pod's UID (DDPJOB_POD_UID, the downward
API), so the peer that removes it reads it from the round's node list; no clock of one machine is compared with
another's to tell which pod of a name was meant.

Sent from a thread of its own (ddpjob_worker.sender): the agent's monitor loop never waits for the API server.
Off outside a cluster or when the job does not report progress (``DDPJOB_REPORT_PROGRESS``).
"""

from __future__ import annotations

import os
import secrets
import socket
import time
import uuid
from collections.abc import Mapping
from typing import Any

from ddpjob_worker import contract
from ddpjob_worker.logs import get_logger
from ddpjob_worker.progress import InClusterApi, StatusApi, patch_progress, rfc3339_ms
from ddpjob_worker.sender import Sender

log = get_logger("peerreport")


def pod_of(node: str) -> str:
    """The pod name in a rendezvous node descriptor (``<addr>_<pid>_<local id>``, the address being the pod's
    FQDN ``<pod>.<subdomain>.<namespace>.svc...``, as the operator sets hostname and subdomain)."""
    addr = node.rsplit("_", 2)[0]
    return addr.split(".", 1)[0]


#: Bits of a node's id (torch's ``pid`` field of its rendezvous node) below the pod's UID: random, so that two
#: incarnations of an agent in one pod would still be two participants (compat.renew_node says why that matters).
_RANDOM_BITS = 31


def node_id(environ: Mapping[str, str]) -> int:
    """This agent's id in the rendezvous: its pod's UID (as an integer) above random bits; random bits alone outside
    a pod (``ddpjob run``), or with a UID that is not one."""
    low = secrets.randbits(_RANDOM_BITS)
    try:
        return (uuid.UUID(environ.get(contract.DDPJOB_POD_UID, "")).int << _RANDOM_BITS) | low
    except ValueError:
        return low


def uid_of(node: str) -> str | None:
    """The pod UID in a rendezvous node descriptor named by :func:`node_id`, or None (a node named otherwise)."""
    try:
        value = int(node.rsplit("_", 2)[1]) >> _RANDOM_BITS
    except (IndexError, ValueError):
        return None
    return str(uuid.UUID(int=value)) if 0 < value < 1 << 128 else None


class PeerReport:
    """``silent({node: seconds})`` hands the report to the sender thread and returns."""

    def __init__(self, environ: Mapping[str, str] = os.environ, api: StatusApi | None = None) -> None:
        self.name = environ.get(contract.DDPJOB_NAME, "")
        self.namespace = environ.get(contract.DDPJOB_NAMESPACE, "")
        self.me = environ.get("HOSTNAME") or socket.gethostname()
        self.on = environ.get(contract.DDPJOB_REPORT_PROGRESS) == "1" and bool(self.name and self.namespace)
        self._api = api
        self._sender = Sender(self._send, name="ddpjob-peer-report")

    def silent(self, nodes: Mapping[str, float], now: float | None = None) -> dict[str, Any]:
        """Report these rendezvous nodes silent for so many seconds; returns the patch (empty when reporting is
        off). A node that names no UID is reported without one: the operator then leaves its pod to Kubernetes."""
        if not self.on or not nodes:
            return {}
        at = time.time() if now is None else now
        patch = {"lostPeers": {pod_of(node): {**({"uid": uid} if (uid := uid_of(node)) else {}),
                                              "silentSince": rfc3339_ms(at - seconds), "reportTime": rfc3339_ms(at),
                                              "by": self.me} for node, seconds in nodes.items()}}
        self._sender.submit(patch)
        return patch

    def drain(self, timeout: float) -> bool:
        return self._sender.drain(timeout)

    def _send(self, progress: Mapping[str, Any]) -> None:
        try:
            if self._api is None:
                self._api = InClusterApi.from_environ(os.environ)
            patch_progress(self._api, self.namespace, self.name, progress)
            log.info("reported to the operator: %s silent", ", ".join(progress.get("lostPeers", {})))
        except Exception as err:  # the operator still learns it from Kubernetes, later
            log.warning("could not report silent peer(s) to the operator (it learns of them when Kubernetes "
                        "calls their node NotReady): %s", err)

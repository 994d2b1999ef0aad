"""Checkpoints of any framework survive the loss of the pod that wrote them (docs/checkpoints.md, "Your framework's
checkpoints"): the agent replicates whatever the script writes under the checkpoint folder to the job's other pods
(replicator), makes every pod of a new group hold the same newest complete checkpoints before it starts
(groupsync), and, with ``spec.checkpoint.objectStore``, uploads them and restores them when every pod starts fresh
(tier). Pure bookkeeping in units and ledger; I/O in scan, transport, replicator, groupsync and tier.

This module is the agent's handle on it: ``start(environ)`` in ddpjob_worker.launch before torchrun runs,
``ACTIVE.sync(group)`` after each rendezvous (ddpjob_worker.agent), ``ACTIVE.close(seconds)`` when the agent ends.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ddpjob_worker import contract
from ddpjob_worker.logs import get_logger

log = get_logger("replication")

#: Seconds between two DNS lookups of the job's pods.
DNS_SECONDS = 5.0


class Runtime:
    """The replicator (and the object-store tier, if any) of this agent."""

    def __init__(self, rep: Any, tier: Any | None) -> None:
        self.rep = rep
        self.tier = tier

    def sync(self, group: Any) -> None:
        """Before the group's trainers start: agree on the checkpoints (groupsync); rank 0 uploads from now on."""
        from ddpjob_worker.replication import groupsync

        rank, world = int(group.group_rank or 0), int(group.group_world_size or 1)
        self.rep.world = world * int(getattr(group.spec, "local_world_size", 1) or 1)
        t0 = time.monotonic()
        groupsync.sync(self.rep, group.store, rank, world, remote=self.tier)
        if self.tier is not None:
            (self.tier.uploading.set if rank == 0 else self.tier.uploading.clear)()
        log.info("checkpoint sync of the group took %.2f s", time.monotonic() - t0)

    def close(self, seconds: float) -> None:
        """The agent ends: upload what is complete and not uploaded yet (a SIGTERM checkpoint), then stop."""
        if self.tier is not None:
            self.rep.scan_once(force=True)
            self.tier.flush(seconds)
        self.rep.stop()


ACTIVE: Runtime | None = None


def dns_peers(service: str, port: int) -> Callable[[], list[str]]:
    """The job's pods from its headless Service's records (publishNotReadyAddresses: starting pods too), looked up
    at most every DNS_SECONDS; the rendezvous pod is among them and simply does not answer."""
    cache: dict[str, Any] = {"at": -DNS_SECONDS, "peers": []}
    lock = threading.Lock()

    def peers() -> list[str]:
        with lock:
            if time.monotonic() - cache["at"] >= DNS_SECONDS:
                cache["at"] = time.monotonic()
                try:
                    infos = socket.getaddrinfo(service, port, type=socket.SOCK_STREAM)
                    cache["peers"] = sorted({f"{i[4][0]}:{port}" for i in infos})
                except OSError:
                    pass  # keep the last answer: a DNS hiccup must not forget the peers
            return list(cache["peers"])

    return peers


def start(environ: Mapping[str, str] = os.environ) -> Runtime | None:
    """Start replication when the operator asked for it (DDPJOB_REPLICATION=1); None otherwise or when it cannot
    start (logged: training goes on without it, as before)."""
    global ACTIVE
    from ddpjob_worker import objectstore

    replicate = environ.get(contract.DDPJOB_REPLICATION) == "1"
    if not replicate and not environ.get(objectstore.ENDPOINT_ENV):
        return None
    from ddpjob_worker.replication.replicator import Replicator

    try:
        port = int(environ.get(contract.DDPJOB_REPLICA_PORT) or contract.DEFAULT_REPLICA_PORT)
        explicit = [p.strip() for p in environ.get(contract.DDPJOB_REPLICA_PEERS, "").split(",") if p.strip()]
        service = environ.get(contract.DDPJOB_REPLICA_SERVICE, "")
        peers: Callable[[], list[str]] = (
            (lambda: []) if not replicate  # a shared claim: only the object-store tier
            else (lambda: explicit) if explicit else dns_peers(service, port) if service else (lambda: []))
        # The pod's name (<job>-worker-<index>): what messages name, and the same in every incarnation of the pod.
        name = f"{environ.get(contract.DDPJOB_NAME, 'job')}-worker-{environ.get(contract.DDPJOB_WORKER_INDEX, '0')}"
        address = environ.get(contract.DDPJOB_REPLICA_ADDRESS) or socket.gethostbyname(socket.gethostname())
        rep = Replicator(Path(environ[contract.DDPJOB_CHECKPOINT_DIR]), name, environ.get(contract.DDPJOB_UID, ""),
                         peers, keep=int(environ.get(contract.DDPJOB_CHECKPOINT_KEEP) or 3),
                         budget=int(environ.get(contract.DDPJOB_REPLICA_BUDGET_BYTES) or 0))
        rep.start("0.0.0.0", port, advertise=address)
        tier = _tier(rep, environ)
    except Exception as err:  # replication is an addition: its failure to start must not stop training
        log.error("checkpoint replication could not start (%s: %s): this pod's checkpoints stay on this pod",
                  type(err).__name__, err)
        return None
    ACTIVE = Runtime(rep, tier)
    return ACTIVE


def _tier(rep: Any, environ: Mapping[str, str]) -> Any | None:
    from ddpjob_worker import objectstore

    config = objectstore.ObjectStoreConfig.from_env(environ)
    if config is None:
        return None
    from ddpjob_worker.replication.tier import Tier

    tier = Tier(rep, objectstore.ObjectStore(config))
    tier.start()
    log.info("checkpoints are uploaded to %r", config)
    return tier

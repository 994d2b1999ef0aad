"""The workers' identity in each namespace (builders.build_worker_identity): created by the first pass of a job
there, then known to exist until one of its objects is deleted (watched), a pod create there is refused or the
next resync, when the next pass creates it again (each create of an existing object is a harmless 409). So a
namespace costs 3 creates, not every job, and a deleted ServiceAccount, Role or RoleBinding is back within a
second.

An object of the same name that the operator did not create is used as it is: a cluster that annotates the
namespace's ``ddpjob-worker`` ServiceAccount for cloud credentials (IRSA, Workload Identity) keeps its own."""

from __future__ import annotations

import asyncio
import logging

from ddpjob_operator.kube.client import Kube, watch_resource
from ddpjob_operator.planner.children import builders
from ddpjob_operator.planner.policies import children
from ddpjob_operator.planner.policies.children import ChildKey, Problem

log = logging.getLogger("ddpjob.identity")

_OBJECTS = builders.build_worker_identity("")
#: (kind, name) of the identity's objects: the same in every namespace.
IDENTITY_KEYS = tuple(children.key(o) for o in _OBJECTS)
#: kopf's names of the identity's resources (watched by names.IDENTITY_LABEL).
IDENTITY_RESOURCES = tuple(watch_resource(o["kind"], o["apiVersion"]) for o in _OBJECTS)


class WorkerIdentity:
    """Which namespaces have the worker identity, as far as this operator process knows."""

    def __init__(self) -> None:
        self._ready: set[str] = set()
        self._locks: dict[str, asyncio.Lock] = {}

    async def ensure(self, kube: Kube, namespace: str) -> list[tuple[ChildKey, Problem | None]]:
        """Create the namespace's identity unless known to exist; returns each object's (kind, name) with the
        refusal of its create, or None (it exists). One pass creates it while the others wait, so a burst of jobs
        in a new namespace costs 3 creates, not 3 per job."""
        if namespace in self._ready:  # every pass asks: nothing is built or sent then
            return [(k, None) for k in IDENTITY_KEYS]
        lock = self._locks.setdefault(namespace, asyncio.Lock())
        async with lock:
            if namespace in self._ready:
                return [(k, None) for k in IDENTITY_KEYS]
            objs = builders.build_worker_identity(namespace)
            results = await asyncio.gather(*(kube.create(obj) for obj in objs))
            answers = [(children.key(o), r.refused) for o, r in zip(objs, results, strict=True)]
            if all(problem is None for _, problem in answers):
                self._ready.add(namespace)
                if any(r.obj is not None for r in results):
                    log.info("namespace %s: created the workers' ServiceAccount, Role and RoleBinding %s", namespace,
                             objs[0]["metadata"]["name"])
            return answers

    def forget(self, namespace: str | None = None) -> None:
        """Check one namespace (a pod create there was refused) or all of them (a resync) again."""
        if namespace is None:
            self._ready.clear()
        else:
            self._ready.discard(namespace)

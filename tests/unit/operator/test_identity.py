"""The namespace's worker identity (identity.py) against a fake API layer whose creates take time, so passes of
many jobs really overlap: created once per namespace, again after a refusal, forget() or a resync."""

from __future__ import annotations

import asyncio
from typing import Any

from ddpjob_operator.kube.client import Created, refusal
from ddpjob_operator.kube.identity import WorkerIdentity

IDENTITY = [("ServiceAccount", "ddpjob-worker"), ("Role", "ddpjob-worker"), ("RoleBinding", "ddpjob-worker")]


class SlowKube:
    """Creates that yield to the event loop, answer 409 for a name that exists and can refuse one kind."""

    def __init__(self, refuse: str | None = None) -> None:
        self.objects: set[tuple[str, str, str]] = set()
        self.creates: list[tuple[str, str]] = []
        self.refuse = refuse

    async def create(self, obj: dict[str, Any]) -> Created:
        kind, meta = obj["kind"], obj["metadata"]
        self.creates.append((meta["namespace"], kind))
        await asyncio.sleep(0.01)
        if kind == self.refuse:
            plural = f"{kind.lower()}s"
            return Created(refused=refusal(kind, meta["name"], f'{plural} is forbidden: User "system:serviceaccount:'
                                           f'ddpjob-system:ddpjob-operator" cannot create resource "{plural}"'))
        key = (meta["namespace"], kind, meta["name"])
        if key in self.objects:
            return Created(existing=obj)
        self.objects.add(key)
        return Created(obj=obj)


def test_a_burst_of_jobs_in_two_namespaces_creates_each_identity_once() -> None:
    kube, identity = SlowKube(), WorkerIdentity()

    async def burst() -> list[Any]:
        return await asyncio.gather(*(identity.ensure(kube, ns) for ns in ["a"] * 20 + ["b"] * 5))  # type: ignore[arg-type]

    answers = asyncio.run(burst())
    assert sorted(kube.creates) == sorted((ns, kind) for ns in "ab" for kind, _ in IDENTITY)
    assert all(a == [(k, None) for k in IDENTITY] for a in answers)


def test_a_refused_create_is_reported_and_tried_again_on_the_next_pass() -> None:
    kube, identity = SlowKube(refuse="RoleBinding"), WorkerIdentity()
    answer = asyncio.run(identity.ensure(kube, "a"))  # type: ignore[arg-type]
    assert answer[:2] == [(k, None) for k in IDENTITY[:2]]
    assert answer[2][0] == IDENTITY[2] and answer[2][1] is not None and answer[2][1].reason == "Forbidden"
    kube.refuse = None
    assert asyncio.run(identity.ensure(kube, "a")) == [(k, None) for k in IDENTITY]  # type: ignore[arg-type]
    assert len(kube.creates) == 6


def test_forget_checks_again_once_and_a_409_counts_as_there() -> None:
    kube, identity = SlowKube(), WorkerIdentity()
    asyncio.run(identity.ensure(kube, "a"))  # type: ignore[arg-type]
    asyncio.run(identity.ensure(kube, "a"))  # type: ignore[arg-type]
    assert len(kube.creates) == 3
    identity.forget("a")
    assert asyncio.run(identity.ensure(kube, "a")) == [(k, None) for k in IDENTITY]  # type: ignore[arg-type]
    identity.forget()
    asyncio.run(identity.ensure(kube, "a"))  # type: ignore[arg-type]
    assert len(kube.creates) == 9

"""The env contract round-trips: what the operator writes (``WorkerEnv.to_env``) is what the worker reads back
(``WorkerEnv.from_env``), for every field and any combination of values (issue 43 #15: peer_timeout_seconds did
not: a pod told 30 s ran with the default 5 s)."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from ddpjob_worker import contract

#: Valid values of every field, each field's default among them or not: a field added to WorkerEnv needs its
#: values here (test_every_field_has_values_to_try).
VALUES: dict[str, list[Any]] = {
    "job_name": ["j", "a-job-name-of-forty-five-characters-xxxxxxxxx"],
    "namespace": ["ns", "local", "team-a"],
    "job_uid": ["uid-1", "0b4c7a1e-2f3d-4e5f-8a9b-0c1d2e3f4a5b", "local-j-1234abcd"],
    "worker_index": [0, 1, 10015],
    "min_nodes": [1, 2, 3, 10000],
    "max_nodes": [1, 2, 4, 10000],
    "nproc_per_node": ["auto", "gpu", "cpu", "1", "8"],
    "rdzv_endpoint": ["j-rdzv.j.ns.svc:29400", "127.0.0.1:1", "h:65535"],
    "max_restarts": [0, 3, 100],
    "checkpoint_dir": ["/checkpoints", "/tmp/a dir"],
    "rdzv_conf": ["is_host=false", "is_host=false,join_timeout=600,last_call_timeout=30,close_timeout=60"],
    "sigterm_budget_seconds": [1, 60, 3600],
    "report_progress": [False, True],
    "checkpoint_keep": [1, 3, 50],
    "progress_file": ["", "/tmp/p.json"],
    "peer_timeout_seconds": [0, 5, 30, 600],
    "termination_log": ["", "/dev/termination-log", "/tmp/t.log"],
}


def make(values: dict[str, Any]) -> contract.WorkerEnv:
    low, high = sorted((values["min_nodes"], values["max_nodes"]))  # the contract's own rule: MIN <= MAX
    return contract.WorkerEnv(**{**values, "min_nodes": low, "max_nodes": high})


def combinations(count: int, seed: int = 43) -> list[contract.WorkerEnv]:
    """Each value of each field once (the others at their first value), then ``count`` random combinations."""
    first = {name: values[0] for name, values in VALUES.items()}
    single = [make({**first, name: value}) for name, values in VALUES.items() for value in values]
    rng = random.Random(seed)
    return single + [make({name: rng.choice(values) for name, values in VALUES.items()}) for _ in range(count)]


def test_every_field_has_values_to_try() -> None:
    fields = {f.name: f for f in dataclasses.fields(contract.WorkerEnv)}
    assert set(VALUES) == set(fields), "add the new field's values to VALUES"
    for name, f in fields.items():
        if f.default is not dataclasses.MISSING:
            assert any(v != f.default for v in VALUES[name]), f"{name}: try a value other than its default"


def test_the_contract_round_trips() -> None:
    for env in combinations(1000):
        back = contract.WorkerEnv.from_env(env.to_env())
        lost = {f.name: (getattr(env, f.name), getattr(back, f.name)) for f in dataclasses.fields(env)
                if getattr(env, f.name) != getattr(back, f.name)}
        assert not lost, f"written -> read back: {lost}"


def test_a_peer_timeout_that_is_not_a_number_names_the_variable() -> None:
    raw = {**combinations(0)[0].to_env(), contract.DDPJOB_PEER_TIMEOUT_SECONDS: "5s"}
    with pytest.raises(contract.ContractError, match="DDPJOB_PEER_TIMEOUT_SECONDS='5s' is not an integer"):
        contract.WorkerEnv.from_env(raw)
    del raw[contract.DDPJOB_PEER_TIMEOUT_SECONDS]  # an older operator's pod: the default
    assert contract.WorkerEnv.from_env(raw).peer_timeout_seconds == contract.DEFAULT_PEER_TIMEOUT_SECONDS

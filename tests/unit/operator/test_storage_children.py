"""spec.checkpoint's replication and object store in the worker pods (planner/children/storage.py), and what the
API refuses (api/checkpointing.py)."""

from __future__ import annotations

from typing import Any

import pytest
from ddpjob_operator.api.spec import InvalidSpec, parse_ddpjob
from ddpjob_operator.planner.children import builders, storage

from tests.unit.operator.factories import make_job

pytestmark = pytest.mark.unit
Obj = dict[str, Any]

STORE = {"endpoint": "https://s3.example:9000", "bucket": "ckpts", "prefix": "team-a/",
         "credentialsSecret": "s3-creds"}


def worker(**checkpoint: Any) -> Obj:
    job = parse_ddpjob(make_job(name="hf", namespace="ml").with_spec(checkpoint=checkpoint).obj())
    pod = builders.build_worker_pod(job, 0)
    return pod


def env_of(pod: Obj) -> dict[str, Any]:
    c = pod["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def test_each_pod_with_its_own_folder_replicates_by_default() -> None:
    env = env_of(worker())
    assert env["DDPJOB_REPLICATION"] == "1"
    assert env["DDPJOB_REPLICA_SERVICE"] == "hf.ml.svc"
    assert env["DDPJOB_REPLICA_SYNC_SECONDS"] == "300"
    assert "DDPJOB_REPLICA_BUDGET_BYTES" not in env


@pytest.mark.parametrize(("checkpoint", "on"), [
    pytest.param({"existingClaim": "shared"}, False, id="claim-off"),
    pytest.param({"existingClaim": "shared", "replication": {"enabled": True}}, True, id="claim-forced-on"),
    pytest.param({"replication": {"enabled": False}}, False, id="emptydir-off"),
])
def test_replication_follows_the_volume_unless_set(checkpoint: Obj, on: bool) -> None:
    assert ("DDPJOB_REPLICATION" in env_of(worker(**checkpoint))) is on


def test_the_budget_in_bytes() -> None:
    assert env_of(worker(replication={"maxBytes": "2Gi"}))["DDPJOB_REPLICA_BUDGET_BYTES"] == str(2 << 30)


def test_the_object_store_reaches_the_workers_by_reference() -> None:
    pod = worker(objectStore={**STORE, "caBundle": {"configMap": "s3-ca"}})
    env = env_of(pod)
    assert env["DDPJOB_OBJECT_STORE_ENDPOINT"] == "https://s3.example:9000"
    assert env["DDPJOB_OBJECT_STORE_PREFIX"] == "team-a/ml/hf/"
    assert env["AWS_ACCESS_KEY_ID"] == {"secretKeyRef": {"name": "s3-creds", "key": "AWS_ACCESS_KEY_ID"}}
    assert env["AWS_SESSION_TOKEN"]["secretKeyRef"]["optional"] is True
    assert env["AWS_CA_BUNDLE"] == f"{storage.CA_MOUNT_PATH}/ca.crt"
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == storage.CA_VOLUME)
    assert volume["configMap"] == {"name": "s3-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    mounts = pod["spec"]["containers"][0]["volumeMounts"]
    assert {"name": storage.CA_VOLUME, "mountPath": storage.CA_MOUNT_PATH, "readOnly": True} in mounts


@pytest.mark.parametrize(("store", "field"), [
    pytest.param({**STORE, "endpoint": "s3.example:9000"}, "endpoint", id="no-scheme"),
    pytest.param({**STORE, "bucket": "Ckpts"}, "bucket", id="bucket-case"),
    pytest.param({**STORE, "prefix": "/abs"}, "prefix", id="prefix-slash"),
    pytest.param({k: v for k, v in STORE.items() if k != "credentialsSecret"}, "credentialsSecret", id="no-secret"),
    pytest.param({**STORE, "caBundle": {"configMap": "a", "secret": "b"}}, "caBundle", id="ca-two-sources"),
    pytest.param({**STORE, "accessKey": "AKIA"}, "accessKey", id="typo-or-inline-key"),
])
def test_a_bad_object_store_is_refused_naming_the_field(store: Obj, field: str) -> None:
    with pytest.raises(InvalidSpec) as err:
        parse_ddpjob(make_job().with_spec(checkpoint={"objectStore": store}).obj())
    assert "spec.checkpoint.objectStore" in err.value.field or "objectStore" in str(err.value)
    assert field in str(err.value)


def test_a_queued_job_needs_a_claim_or_an_object_store() -> None:
    queued = make_job().obj()
    queued["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team"}
    with pytest.raises(InvalidSpec, match="objectStore"):
        parse_ddpjob(queued)
    queued["spec"]["checkpoint"] = {"objectStore": STORE}
    assert parse_ddpjob(queued).spec.checkpoint.object_store is not None

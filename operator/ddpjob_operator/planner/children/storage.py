"""What a worker pod gets for spec.checkpoint beyond its volume: the replication settings (each pod's own folder is
copied to the others) and the object store's endpoint, credentials (from the user's Secret, as references: the
values never pass through the operator) and CA bundle. Pure."""

from __future__ import annotations

from typing import Any

from ddpjob_worker import contract, objectstore

from ddpjob_operator.api import names
from ddpjob_operator.api.spec import DDPJob

Obj = dict[str, Any]

#: The pod volume (and mount) of the object store's CA bundle; a template may not define a volume of that name.
CA_VOLUME = "ddpjob-object-store-ca"
CA_MOUNT_PATH = "/ddpjob-object-store-ca"
_CREDENTIALS = ((objectstore.ACCESS_KEY_ENV, False), (objectstore.SECRET_KEY_ENV, False),
                (objectstore.SESSION_TOKEN_ENV, True))
_UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50,
          "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}


def quantity_bytes(value: str) -> int:
    """``50Gi`` -> bytes (the schema already checked the form)."""
    for suffix in sorted(_UNITS, key=len, reverse=True):
        if value.endswith(suffix):
            return int(float(value[: -len(suffix)]) * _UNITS[suffix])
    return int(float(value))


def storage_env(job: DDPJob) -> list[Obj]:
    """The worker container's variables for replication and the object store (appended to the contract's)."""
    ckpt = job.spec.checkpoint
    env: list[Obj] = []
    if ckpt.replicates:
        env += [{"name": contract.DDPJOB_REPLICATION, "value": "1"},
                {"name": contract.DDPJOB_REPLICA_SERVICE,
                 "value": f"{names.service_name(job.name)}.{job.namespace}.svc"},
                {"name": contract.DDPJOB_REPLICA_SYNC_SECONDS, "value": str(ckpt.replication.sync_timeout_seconds)}]
        if ckpt.replication.max_bytes:
            env.append({"name": contract.DDPJOB_REPLICA_BUDGET_BYTES,
                        "value": str(quantity_bytes(ckpt.replication.max_bytes))})
    store = ckpt.object_store
    if store is None:
        return env
    env += [{"name": objectstore.ENDPOINT_ENV, "value": store.endpoint},
            {"name": objectstore.BUCKET_ENV, "value": store.bucket},
            {"name": objectstore.PREFIX_ENV, "value": store.job_prefix(job.namespace, job.name)},
            {"name": objectstore.REGION_ENV, "value": store.region}]
    env += [{"name": key, "valueFrom": {"secretKeyRef": {"name": store.credentials_secret, "key": key,
                                                         **({"optional": True} if optional else {})}}}
            for key, optional in _CREDENTIALS]
    if store.ca_bundle is not None:
        env.append({"name": objectstore.CA_BUNDLE_ENV, "value": f"{CA_MOUNT_PATH}/{store.ca_bundle.key}"})
    return env


def storage_volumes(job: DDPJob) -> tuple[list[Obj], list[Obj]]:
    """(pod volumes, worker mounts) for the object store's CA bundle, if any."""
    store = job.spec.checkpoint.object_store
    if store is None or store.ca_bundle is None:
        return [], []
    ca = store.ca_bundle
    items = [{"key": ca.key, "path": ca.key}]
    source = ({"configMap": {"name": ca.config_map, "items": items}} if ca.config_map
              else {"secret": {"secretName": ca.secret, "items": items}})
    return [{"name": CA_VOLUME, **source}], [{"name": CA_VOLUME, "mountPath": CA_MOUNT_PATH, "readOnly": True}]

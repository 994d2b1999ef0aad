"""The thin Kubernetes I/O layer: create (idempotent), delete (UID-checked), patch status, read nodes.

It reuses kopf's own authenticated aiohttp session (``kopf._cogs.clients.api``, stable within kopf 1.x):
no second client, no thread pool, one connection pool and one set of credentials for watches and writes.
Errors are mapped once here: AlreadyExists is success, NotFound on delete is success, transient API
trouble is ``kopf.TemporaryError``, and a 400/422 on create is ``Rejected`` (the API server refused the
object, e.g. a pod template it cannot accept; retrying cannot help).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Mapping
from typing import Any, cast

import aiohttp
import kopf
from kopf._cogs.clients import api as kopf_api
from kopf._cogs.clients import errors as kopf_errors

from ddpjob_operator.names import FIELD_MANAGER
from ddpjob_operator.spec import API_VERSION, PLURAL

Obj = dict[str, Any]

#: Retries inside one call before the pass gives up with TemporaryError (the queue retries the pass).
_BACKOFFS = (0.2, 0.5, 1.0)

_PLURALS = {
    "Pod": "pods",
    "Service": "services",
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "ServiceAccount": "serviceaccounts",
    "Role": "roles",
    "RoleBinding": "rolebindings",
}


class Rejected(Exception):
    """The API server refused an object as invalid (400/422); ``message`` is its explanation."""

    def __init__(self, kind: str, name: str, message: str) -> None:
        super().__init__(f"{kind} {name}: {message}")
        self.kind = kind
        self.message = message


def collection_url(api_version: str, kind: str, namespace: str) -> str:
    """REST path of a namespaced collection (``/api/v1/namespaces/ns/pods``)."""
    plural = PLURAL if api_version == API_VERSION else _PLURALS[kind]
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{prefix}/namespaces/{namespace}/{plural}"


def adopt(obj: Obj, owner: Mapping[str, Any]) -> Obj:
    """Add a controller ownerReference to the DDPJob, so the child is garbage-collected with it.

    Only the ownerReference part of ``kopf.adopt``: kopf.adopt would also copy the DDPJob's own labels onto
    every child, and a queue label (Kueue) copied onto pods would make another controller manage them.
    """
    kopf.append_owner_reference(obj, owner=cast(kopf.Body, owner))
    return obj


class NamespaceTerminating(Exception):
    """The namespace is being deleted: nothing can be created there any more, and the job goes with it."""


class Kube:
    """Create/delete/patch through kopf's API session, with this project's error semantics."""

    def __init__(self, settings: kopf.OperatorSettings, logger: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        self.settings = settings
        self.logger = logger

    async def _call(self, method: str, url: str, payload: object | None = None, content_type: str | None = None) -> Obj:
        headers = {"Content-Type": content_type} if content_type else None
        try:
            response = await kopf_api.request(
                method,
                url,
                payload=payload,
                headers=headers,
                backoffs=_BACKOFFS,
                settings=self.settings,
                logger=self.logger,
            )
            async with response:
                text = await response.text()
        except (kopf_errors.APIServerError, kopf_errors.APITooManyRequestsError) as err:
            raise kopf.TemporaryError(f"{method.upper()} {url}: {err}", delay=2) from err
        except (aiohttp.ClientError, TimeoutError) as err:
            raise kopf.TemporaryError(f"{method.upper()} {url}: {err!r}", delay=2) from err
        return cast(Obj, json.loads(text)) if text else {}

    async def create(self, obj: Obj) -> Obj | None:
        """Create ``obj``; return the created object, or None when it already exists (409 is success)."""
        meta = obj["metadata"]
        url = collection_url(obj["apiVersion"], obj["kind"], meta["namespace"])
        try:
            return await self._call("post", f"{url}?fieldManager={FIELD_MANAGER}", obj)
        except kopf_errors.APIConflictError:
            return None
        except kopf_errors.APIForbiddenError as err:
            details: dict[str, Any] = dict(err.details or {})
            causes = details.get("causes") or []
            if any(c.get("reason") == "NamespaceTerminating" for c in causes):
                raise NamespaceTerminating(meta["namespace"]) from err
            raise kopf.TemporaryError(f"create {obj['kind']} {meta['name']}: {err}", delay=10) from err
        except (kopf_errors.APIUnprocessableEntityError, kopf_errors.APIClientError) as err:
            if err.status in (400, 422):
                raise Rejected(obj["kind"], meta["name"], err.message or str(err)) from err
            raise kopf.TemporaryError(f"create {obj['kind']} {meta['name']}: {err}", delay=5) from err

    async def delete_pod(self, namespace: str, name: str, uid: str, *, force: bool) -> bool:
        """Delete a pod only if it still has ``uid`` (never a newer pod of the same name); True if deleted."""
        options: Obj = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": uid},
            "propagationPolicy": "Background",
        }
        if force:
            options["gracePeriodSeconds"] = 0
        try:
            await self._call("delete", f"/api/v1/namespaces/{namespace}/pods/{name}", options)
        except (kopf_errors.APINotFoundError, kopf_errors.APIConflictError):
            return False  # already gone, or the name now belongs to a newer pod
        return True

    async def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> Obj:
        """JSON-merge-patch the operator's own status keys (never status.progress); returns the object."""
        url = f"/apis/{API_VERSION}/namespaces/{namespace}/{PLURAL}/{name}/status?fieldManager={FIELD_MANAGER}"
        try:
            return await self._call("patch", url, {"status": dict(status)}, "application/merge-patch+json")
        except kopf_errors.APINotFoundError:
            return {}  # deleted meanwhile: nothing to report on

    async def delete_job(self, namespace: str, name: str, uid: str) -> None:
        """Delete the DDPJob (TTL); children follow by garbage collection, a retained PVC stays."""
        options = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": uid},
            "propagationPolicy": "Background",
        }
        with contextlib.suppress(kopf_errors.APINotFoundError, kopf_errors.APIConflictError):
            await self._call("delete", f"/apis/{API_VERSION}/namespaces/{namespace}/{PLURAL}/{name}", options)

    async def node_ready(self, name: str) -> bool:
        """Whether node ``name`` reports Ready=True (a missing node is not ready)."""
        try:
            node = await self._call("get", f"/api/v1/nodes/{name}")
        except kopf_errors.APINotFoundError:
            return False
        except kopf_errors.APIForbiddenError:
            return True  # without RBAC on nodes, never force-delete on a guess
        conds = (node.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)

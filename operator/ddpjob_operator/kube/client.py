"""The thin Kubernetes I/O layer: create (idempotent), get, list, delete (UID-checked), patch status, read nodes.

It reuses kopf's own authenticated aiohttp session (kopf's private API client, reached through kube/kopf_compat.py):
no second client, no thread pool, one connection pool and one set of credentials for watches and writes.
Errors are mapped once here: AlreadyExists is success, NotFound on delete is success, transient API
trouble is ``kopf.TemporaryError``, a 400/422 on create is ``Rejected`` (the API server refused the
object, e.g. a pod template it cannot accept; retrying cannot help), and a 403 on create (RBAC, quota,
PodSecurity) is a *refusal* the caller reports as a condition and retries with backoff: it may pass later.

PERMISSIONS lists every verb this module uses; the chart's RBAC grants exactly these (tests/unit/test_chart.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, cast
from urllib.parse import urlencode

import aiohttp
import kopf
from ddpjob_worker.redact import redact

from ddpjob_operator.api import reasons
from ddpjob_operator.api.names import FIELD_MANAGER
from ddpjob_operator.api.spec import API_VERSION, GROUP, PLURAL
from ddpjob_operator.kube import leader, ratelimit
from ddpjob_operator.kube.kopf_compat import kopf_api, kopf_errors
from ddpjob_operator.kube.refusals import refusal as refusal  # re-exported: callers import it from here
from ddpjob_operator.metrics import registry as metrics
from ddpjob_operator.planner.policies.children import Problem

Obj = dict[str, Any]

#: Retries inside one call before the pass gives up with TemporaryError (the queue retries the pass).
_BACKOFFS = (0.2, 0.5, 1.0)
#: What a call retries (kopf's own list, kopf._cogs.clients.api.request).
_TRANSIENT = (aiohttp.ClientConnectionError, TimeoutError, kopf_errors.APIServerError, kopf_errors.APIForbiddenError,
              kopf_errors.APITooManyRequestsError)

_PLURALS = {
    "Pod": "pods",
    "Service": "services",
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "ServiceAccount": "serviceaccounts",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "NetworkPolicy": "networkpolicies",
    "PodGroup": "podgroups",
    "Workload": "workloads",
}
#: apiVersion of every kind of a job's children: the kinds the operator watches and the resync lists. The
#: namespace's worker identity (ServiceAccount, Role, RoleBinding) is not a job's child: identity.py.
API_VERSIONS = {
    "Pod": "v1",
    "Service": "v1",
    "PersistentVolumeClaim": "v1",
    "NetworkPolicy": "networking.k8s.io/v1",
    "PodGroup": "scheduling.x-k8s.io/v1alpha1",
    "Workload": "kueue.x-k8s.io/v1beta2",
}
#: Kinds of another project's CRD (scheduler-plugins' PodGroup, Kueue's Workload): the operator runs without
#: them, and a job that needs one says so in its status, with the fix.
OPTIONAL_KINDS = frozenset({"PodGroup", "Workload"})
_INSTALL_HINTS = {
    "PodGroup": "install scheduler-plugins with the coscheduling plugin, docs/scheduling.md, or remove "
                "spec.scheduling.gang",
    "Workload": "install Kueue (v0.17 or later) with DDPJob.v1alpha1.ddpjob.io in integrations.externalFrameworks, "
                "docs/scheduling.md, or remove the kueue.x-k8s.io/queue-name label",
}


def watch_resource(kind: str, api_version: str | None = None) -> str:
    """How kopf names the resource of a kind (a child kind's apiVersion by default): ``pods``,
    ``networkpolicies.networking.k8s.io``."""
    group = (api_version or API_VERSIONS[kind]).rpartition("/")[0]
    return f"{_PLURALS[kind]}.{group}" if group else _PLURALS[kind]


#: Items per LIST page (the resync's, and kopf's re-lists). A page is held whole while it is parsed, and a parsed
#: pod is ~30 KB of Python objects (tracemalloc): 100 pods are ~3 MB; the 2,500 pods of 500 jobs held at once
#: were the operator's peak memory.
LIST_PAGE = 100
#: Items per metadata-only LIST page: a kwok pod's metadata is ~4.9 KB of JSON and ~23 KB parsed (managedFields
#: most of it; the whole pod ~9 KB and ~43 KB), so 250 weigh ~6 MB, a page of 100 whole pods ~4 MB. Each page waits
#: its turn at the rate limit behind the creates of starting jobs: while 5,000 jobs were created, a resync's 52 pages
#: of 100 took 117 s, and 45,000 pods in pages of 100 outlived the API server's compaction (410).
METADATA_PAGE = 250
#: The Accept header of a metadata-only LIST (kube-apiserver's PartialObjectMetadataList, Kubernetes 1.15+).
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"

#: Requests of this module in flight at once. Each one holds its own TLS connection in kopf's pool, which has no
#: limit, and a pooled connection keeps ~130 KB of asyncio SSL buffer plus OpenSSL's own (tracemalloc at 500 jobs
#: x 4 workers without a cap: 126 connections, 16.5 MB); a pass creates all of a job's children at once, so 16
#: passes over 64-replica jobs would open a thousand. Not much lower: the passes wait on the API server, and a
#: cap of 24 was seen to halve the operator's request rate in that bench.
MAX_IN_FLIGHT = 64

#: (API group, resource) -> the verbs the operator uses, namespaced; the chart's RBAC must grant exactly these.
#: Children are watched (list, watch), created, and read back (get) when a create finds the name taken; pods
#: are also deleted. The namespace's worker identity is handled the same way (watched by its own label); its Role
#: grants patch on ddpjobs/status, which the operator must hold itself (RBAC escalation rule).
PERMISSIONS: dict[tuple[str, str], tuple[str, ...]] = {
    (GROUP, PLURAL): ("list", "watch", "delete"),
    (GROUP, f"{PLURAL}/status"): ("patch",),
    # Not a call of this module: what OwnerReferencesPermissionEnforcement asks of a blockOwnerDeletion reference.
    (GROUP, f"{PLURAL}/finalizers"): ("update",),
    ("", "pods"): ("get", "list", "watch", "create", "delete", "patch"),
    ("", "services"): ("get", "list", "watch", "create"),
    ("", "serviceaccounts"): ("get", "list", "watch", "create"),
    ("", "persistentvolumeclaims"): ("get", "list", "watch", "create"),
    ("rbac.authorization.k8s.io", "roles"): ("get", "list", "watch", "create"),
    ("rbac.authorization.k8s.io", "rolebindings"): ("get", "list", "watch", "create"),
    ("networking.k8s.io", "networkpolicies"): ("get", "list", "watch", "create"),
    ("scheduling.x-k8s.io", "podgroups"): ("get", "list", "watch", "create"),
    ("kueue.x-k8s.io", "workloads"): ("get", "list", "watch", "create", "patch"),  # patch: a prebuilt one's owner
    ("kueue.x-k8s.io", "workloads/status"): ("patch",),
    ("", "events"): ("create",),
}
#: Cluster-scoped reads (a ClusterRole even when the operator watches only some namespaces).
CLUSTER_PERMISSIONS: dict[tuple[str, str], tuple[str, ...]] = {
    ("", "nodes"): ("get",),
    ("", "namespaces"): ("list", "watch"),
    ("apiextensions.k8s.io", "customresourcedefinitions"): ("list", "watch"),
    ("kueue.x-k8s.io", "resourceflavors"): ("get",),
    ("kueue.x-k8s.io", "workloadpriorityclasses"): ("get",),
    # The chart's worker admission policy and its binding, by name (runtime/isolation.py).
    ("admissionregistration.k8s.io", "validatingadmissionpolicies"): ("get",),
    ("admissionregistration.k8s.io", "validatingadmissionpolicybindings"): ("get",),
}


class Rejected(Exception):
    """The API server refused an object as invalid (400/422); ``message`` is its explanation, redacted: it goes into
    the job's conditions and Events, and the server may quote the object's fields (an env value, a header)."""

    def __init__(self, kind: str, name: str, message: str) -> None:
        message = redact(message)
        super().__init__(f"{kind} {name}: {message}")
        self.kind = kind
        self.name = name
        self.message = message


def collection_url(api_version: str, kind: str, namespace: str | None) -> str:
    """REST path of a namespaced collection (``/api/v1/namespaces/ns/pods``; all namespaces when None)."""
    plural = PLURAL if api_version == API_VERSION else _PLURALS[kind]
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{prefix}/{plural}" if namespace is None else f"{prefix}/namespaces/{namespace}/{plural}"


@dataclasses.dataclass(frozen=True, slots=True)
class Created:
    """What a create came to: the new object, the object already holding the name, or a refusal."""

    obj: Obj | None = None
    existing: Obj | None = None
    """On 409: the object that has the name now (None if it vanished meanwhile)."""
    refused: Problem | None = None


def adopt(obj: Obj, owner: Mapping[str, Any]) -> Obj:
    """Add a controller ownerReference to the DDPJob, so the child is garbage-collected with it.

    Only the ownerReference part of ``kopf.adopt``: kopf.adopt would also copy the DDPJob's own labels onto
    every child, and a queue label (Kueue) copied onto pods would make another controller manage them.
    """
    kopf.append_owner_reference(obj, owner=cast(kopf.Body, owner))
    return obj


def _resource(url: str) -> str:
    """The resource a request's path names, with its subresource (pods, ddpjobs/status, nodes): the metric's label."""
    parts = url.split("?", 1)[0].strip("/").split("/")
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if len(rest) > 2 and rest[0] == "namespaces":
        rest = rest[2:]
    return "/".join(rest[0:3:2]) if rest else ""


def _retry_after(err: kopf_errors.APITooManyRequestsError) -> float:
    """The server's Retry-After (header, else the status details), at least 1 s; 2 s when it gave none."""
    headers: Mapping[str, Any] = err.headers or {}
    details: Mapping[str, Any] = err.details or {}
    value = headers.get("Retry-After") or details.get("retryAfterSeconds")
    try:
        return max(1.0, float(value)) if value is not None else 2.0
    except (TypeError, ValueError):
        return 2.0


class StatusConflict(Exception):
    """A status write was refused (409): the job changed since the body the pass planned from."""


class NamespaceTerminating(Exception):
    """The namespace is being deleted: nothing can be created there any more, and the job goes with it."""


class Kube:
    """Create/delete/patch through kopf's API session, with this project's error semantics."""

    def __init__(self, settings: kopf.OperatorSettings, logger: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        self.settings = settings
        self.logger = logger
        self._in_flight = asyncio.Semaphore(MAX_IN_FLIGHT)
        self._bucket = ratelimit.bucket()

    async def _call(self, method: str, url: str, payload: object | None = None, content_type: str | None = None,
                    *, retries: bool = True, accept: str | None = None) -> Obj:
        """One request, after the rate limit (ratelimit.py). ``retries``: retries of 5xx, 429, 403 and broken
        connections inside the call (kopf's for a read; for a write this loop's, each attempt fenced again, see
        _send); a create goes without them, so a refusal (quota, PodSecurity) is one request and reaches the
        planner at once, and anything else fails the pass, which the queue retries."""
        backoffs = _BACKOFFS if retries else ()
        try:
            if method == "get":
                return await self._send(method, url, payload, content_type, backoffs, accept)
            for delay in backoffs:
                try:
                    return await self._send(method, url, payload, content_type, ())
                except _TRANSIENT:
                    await asyncio.sleep(delay)
            return await self._send(method, url, payload, content_type, ())
        except kopf_errors.APIError as err:
            if isinstance(err, kopf_errors.APITooManyRequestsError):
                raise kopf.TemporaryError(f"{method.upper()} {url}: {err}", delay=_retry_after(err)) from err
            if isinstance(err, kopf_errors.APIServerError):
                raise kopf.TemporaryError(f"{method.upper()} {url}: {err}", delay=2) from err
            raise
        except (aiohttp.ClientError, TimeoutError) as err:
            raise kopf.TemporaryError(f"{method.upper()} {url}: {err!r}", delay=2) from err

    async def _send(self, method: str, url: str, payload: object | None, content_type: str | None,
                    backoffs: tuple[float, ...], accept: str | None = None) -> Obj:
        """One request (kopf retries it after ``backoffs``). A write asks the leader fence (leader.py) last, once
        it has its slot and its turn at the rate limit: a leader that lost the Lease while it waited sends
        nothing (asked before the waits, it sent writes seconds after another replica took over)."""
        headers = {**({"Content-Type": content_type} if content_type else {}), **({"Accept": accept} if accept else {})}
        code, sent = 0, False
        started = time.monotonic()
        try:
            async with self._in_flight:
                await self._bucket.acquire()
                if method != "get" and not leader.may_write():
                    # Past the renew deadline another replica may lead: its writes, not this one's.
                    raise kopf.TemporaryError(f"{method.upper()} {url}: not the leader (lease not renewed)", delay=5)
                started, sent = time.monotonic(), True  # the request alone: not the wait for a slot or a token
                response = await kopf_api.request(method, url, payload=payload, headers=headers or None,
                                                  backoffs=backoffs, settings=self.settings, logger=self.logger)
                code = response.status
                async with response:
                    text = await response.text()
        except kopf_errors.APIError as err:
            code = err.status or 0
            raise
        finally:
            if sent:  # one count per request sent: kopf's retries inside a read are not seen here
                metrics.API_REQUESTS.labels(method.upper(), _resource(url), str(code)).inc()
                metrics.API_LATENCY.labels(method.upper(), _resource(url)).observe(time.monotonic() - started)
        return cast(Obj, json.loads(text)) if text else {}

    async def create(self, obj: Obj, *, dry_run: bool = False) -> Created:
        """Create ``obj``: the created object; on 409 the object that holds the name; on 403 a refusal. A pod's
        unknown fields are an error (400, ``Rejected``), never dropped with a warning; ``dry_run``: the API server
        validates and admits it but stores nothing (runtime/pod_check.py)."""
        meta = obj["metadata"]
        url = collection_url(obj["apiVersion"], obj["kind"], meta["namespace"]) + f"?fieldManager={FIELD_MANAGER}"
        url += "&fieldValidation=Strict" if obj["kind"] == "Pod" else ""
        url += "&dryRun=All" if dry_run else ""
        try:
            return Created(obj=await self._call("post", url, obj, retries=False))
        except kopf_errors.APIConflictError:
            return Created(existing=await self.get(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]))
        except kopf_errors.APIForbiddenError as err:
            details: dict[str, Any] = dict(err.details or {})
            causes = details.get("causes") or []
            if any(c.get("reason") == "NamespaceTerminating" for c in causes):
                raise NamespaceTerminating(meta["namespace"]) from err
            return Created(refused=refusal(obj["kind"], meta["name"], err.message or str(err)))
        except kopf_errors.APINotFoundError as err:
            if obj["kind"] not in OPTIONAL_KINDS:
                raise kopf.TemporaryError(f"create {obj['kind']} {meta['name']}: {err}", delay=5) from err
            return Created(refused=Problem(
                kind=obj["kind"], name=meta["name"], conflict=False, reason=reasons.CRD_NOT_INSTALLED,
                message=f"the {obj['kind']} API ({obj['apiVersion']}) is not served: its CRD is not installed (fix: "
                        f"{_INSTALL_HINTS[obj['kind']]})"))
        except (kopf_errors.APIUnprocessableEntityError, kopf_errors.APIClientError) as err:
            if err.status in (400, 422):
                raise Rejected(obj["kind"], meta["name"], err.message or str(err)) from err
            raise kopf.TemporaryError(f"create {obj['kind']} {meta['name']}: {err}", delay=5) from err

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        """One object, or None if it does not exist."""
        try:
            return await self._call("get", f"{collection_url(api_version, kind, namespace)}/{name}")
        except kopf_errors.APINotFoundError:
            return None

    async def pages(
        self, api_version: str, kind: str, namespace: str | None, label_selector: str, *, metadata_only: bool = False
    ) -> AsyncIterator[list[Obj]]:
        """Every object of ``kind`` matching the selector, one page at a time. The caller keeps what it needs of
        a page before asking for the next, so a LIST of thousands of pods is never held whole. ``metadata_only``:
        each item's metadata alone (PartialObjectMetadata), METADATA_PAGE a page."""
        token = ""
        while True:
            limit = METADATA_PAGE if metadata_only else LIST_PAGE
            query = {"labelSelector": label_selector, "limit": str(limit), **({"continue": token} if token else {})}
            page = await self._call("get", f"{collection_url(api_version, kind, namespace)}?{urlencode(query)}",
                                    accept=METADATA_ONLY if metadata_only else None)
            token = str((page.get("metadata") or {}).get("continue") or "")
            yield page.get("items") or []
            if not token:
                return

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

    async def annotate_pod(self, namespace: str, name: str, uid: str, annotations: Mapping[str, str]) -> bool:
        """Merge ``annotations`` into a pod only if it still has ``uid`` (the UID in the patch is a precondition:
        a newer pod of the same name refuses it); True if patched."""
        patch = {"metadata": {"uid": uid, "annotations": dict(annotations)}}
        try:
            await self._call("patch", f"/api/v1/namespaces/{namespace}/pods/{name}", patch,
                             "application/merge-patch+json")
        except (kopf_errors.APINotFoundError, kopf_errors.APIConflictError,
                kopf_errors.APIUnprocessableEntityError):
            return False  # gone, or the name now belongs to a newer pod (409 or 422: the UID is immutable)
        return True

    async def patch_status(self, namespace: str, name: str, status: Mapping[str, Any],
                           resource_version: str = "") -> Obj:
        """JSON-merge-patch the operator's own status keys (never status.progress); returns the object. With
        ``resource_version`` (that of the body the pass planned from) the write is conditional on it: one planned
        from an older body, such as an old leader's that was still on its way when it lost the Lease, is refused
        (StatusConflict) instead of overwriting a newer status and its incidents."""
        url = f"/apis/{API_VERSION}/namespaces/{namespace}/{PLURAL}/{name}/status?fieldManager={FIELD_MANAGER}"
        patch: Obj = {"status": dict(status)}
        if resource_version:
            patch["metadata"] = {"resourceVersion": resource_version}
        try:
            return await self._call("patch", url, patch, "application/merge-patch+json")
        except kopf_errors.APINotFoundError:
            return {}  # deleted meanwhile: nothing to report on
        except kopf_errors.APIConflictError as err:
            raise StatusConflict(f"{namespace}/{name}: changed since resourceVersion {resource_version}") from err

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

    async def get_cluster_scoped(self, api_version: str, plural: str, name: str) -> Obj | None:
        """A cluster-scoped object (a Kueue ResourceFlavor or WorkloadPriorityClass), or None if it is missing."""
        try:
            return await self._call("get", f"/apis/{api_version}/{plural}/{name}")
        except kopf_errors.APINotFoundError:
            return None

    async def patch_workload(self, namespace: str, name: str, patch: Mapping[str, Any], *, status: bool = True
                             ) -> bool:
        """Merge-patch a Kueue Workload's status (or, ``status=False``, the object: a prebuilt Workload's owner),
        conditional on the resourceVersion in ``patch``; False when it is gone or changed meanwhile (the next pass
        looks again)."""
        url = f"{collection_url(API_VERSIONS['Workload'], 'Workload', namespace)}/{name}{'/status' if status else ''}"
        url += f"?fieldManager={FIELD_MANAGER}"
        try:
            await self._call("patch", url, dict(patch), "application/merge-patch+json")
        except (kopf_errors.APINotFoundError, kopf_errors.APIConflictError):
            return False
        return True

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

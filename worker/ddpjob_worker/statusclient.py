"""The worker's one call to the Kubernetes API: a merge patch of its DDPJob's ``status.progress`` (rank 0's progress
reports, ddpjob_worker.progress; the peers an agent removed, ddpjob_worker.peerreport), over HTTPS with the standard
library only (InClusterApi), not the ``kubernetes`` client: the runtime is injected into users' own images, which
have Python and torch and nothing else. The ``kubernetes`` client's CustomObjectsApi (or a test's fake) can stand in
for it (StatusApi)."""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

__all__ = ["GROUP", "MERGE_PATCH", "PLURAL", "REQUEST_TIMEOUT_SECONDS", "SERVICE_ACCOUNT_DIR", "VERSION", "ApiError",
           "InClusterApi", "StatusApi", "patch_progress"]

GROUP, VERSION, PLURAL = "ddpjob.io", "v1alpha1", "ddpjobs"
#: Seconds one status patch may take: a hung API server must not hold a report (or the exit that flushes it).
REQUEST_TIMEOUT_SECONDS = 10
#: Where Kubernetes mounts the pod's service account: ``token`` (a bound token the kubelet rotates, hourly by
#: default), ``ca.crt`` (the cluster CA that signed the API server's certificate).
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MERGE_PATCH = "application/merge-patch+json"


class StatusApi(Protocol):
    """What the reporter needs of an API client: the ``kubernetes`` client's CustomObjectsApi method of that name, so
    that client (or a test's fake) can stand in for InClusterApi."""

    def patch_namespaced_custom_object_status(self, group: str, version: str, namespace: str, plural: str,
                                              name: str, body: Any, **kwargs: Any) -> Any:
        """Patch the status of one custom object.

        Args:
            group: The API group (GROUP).
            version: The API version (VERSION).
            namespace: The object's namespace.
            plural: The resource (PLURAL).
            name: The object's name.
            body: The patch.
            **kwargs: ``_content_type`` (the patch's type) and ``_request_timeout`` (seconds), as the
                ``kubernetes`` client takes them.

        Returns:
            Whatever the client returns; the reporter ignores it.
        """
        ...


class ApiError(Exception):
    """The status patch failed: no in-cluster configuration, or the API server refused or did not answer."""


class InClusterApi:
    """The one call the reporter makes, with the standard library: an HTTPS merge patch of a custom object's status,
    authenticated as the pod's service account (in-cluster configuration, as the ``kubernetes`` client's
    ``load_incluster_config`` reads it).

    Args:
        host: The API server's address.
        port: Its port.
        token_file: The service account token, read at every request (the kubelet rotates it).
        ca_file: The CA that signed the API server's certificate.

    Raises:
        OSError, ssl.SSLError: ``ca_file`` cannot be loaded.
    """

    def __init__(self, host: str, port: int, token_file: Path, ca_file: Path) -> None:
        self.host, self.port, self.token_file = host, port, token_file
        # Loaded once, like the kubernetes client does; it verifies the server's name too (the Service's IP is in
        # the API server's certificate).
        self._tls = ssl.create_default_context(cafile=str(ca_file))

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], directory: Path | None = None) -> InClusterApi:
        """The API server's Service from the environment the kubelet sets, the credentials from ``directory``.

        Args:
            environ: The environment (``KUBERNETES_SERVICE_HOST``, ``KUBERNETES_SERVICE_PORT``).
            directory: Holds ``token`` and ``ca.crt``; None: SERVICE_ACCOUNT_DIR.

        Returns:
            The client.

        Raises:
            ApiError: The pod is not in a cluster, has no service account token, or its CA cannot be loaded.
        """
        host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "")
        if not host or not port.isdigit():
            raise ApiError("not in a cluster (KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT not set)")
        directory = SERVICE_ACCOUNT_DIR if directory is None else directory
        token, ca = directory / "token", directory / "ca.crt"
        if not token.is_file() or not ca.is_file():
            raise ApiError(f"no service account token or CA in {directory} (automountServiceAccountToken off?)")
        try:
            return cls(host, int(port), token, ca)
        except (OSError, ssl.SSLError) as err:
            raise ApiError(f"cannot load the cluster CA {ca}: {err}") from err

    def _token(self) -> str:
        # Read at every request, not once: bound tokens rotate (the kubelet swaps the file well before expiry),
        # and a patch every few seconds at most makes the read free.
        try:
            return self.token_file.read_text().strip()
        except OSError as err:
            raise ApiError(f"cannot read the service account token {self.token_file}: {err}") from err

    def patch_namespaced_custom_object_status(self, group: str, version: str, namespace: str, plural: str,
                                              name: str, body: Any, *, _content_type: str = MERGE_PATCH,
                                              _request_timeout: float = REQUEST_TIMEOUT_SECONDS,
                                              **_: Any) -> Any:
        """PATCH ``/apis/<group>/<version>/namespaces/<ns>/<plural>/<name>/status`` with ``body``.

        Args:
            group: The API group.
            version: The API version.
            namespace: The object's namespace.
            plural: The resource.
            name: The object's name.
            body: The patch, sent as JSON.
            _content_type: The patch's type (a merge patch by default).
            _request_timeout: Seconds that bound the connection, the TLS handshake and each read.
            **_: Other options of the ``kubernetes`` client's method, ignored.

        Returns:
            The object as the API server stored it (its JSON answer; None if that was not JSON).

        Raises:
            ApiError: The server refused the patch, or did not answer in time.
        """
        path = "/apis/{}/{}/namespaces/{}/{}/{}/status".format(*(quote(p, safe="") for p in (
            group, version, namespace, plural, name)))
        headers = {"Authorization": f"Bearer {self._token()}", "Content-Type": _content_type,
                   "Accept": "application/json", "User-Agent": "ddpjob-worker"}
        conn = http.client.HTTPSConnection(self.host, self.port, timeout=_request_timeout, context=self._tls)
        try:
            conn.request("PATCH", path, body=json.dumps(body).encode(), headers=headers)
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as err:  # refused, TLS, timeout (socket.timeout is an OSError)
            raise ApiError(f"PATCH {path}: {str(err) or type(err).__name__}") from err
        finally:
            conn.close()
        if not 200 <= response.status < 300:
            raise ApiError(f"PATCH {path}: {response.status} {response.reason}: {_status_message(data)}")
        try:
            return json.loads(data)
        except ValueError:
            return None


def _status_message(data: bytes) -> str:
    """The message of a Kubernetes Status answer (why a request was refused), else the start of the body."""
    try:
        return str(json.loads(data)["message"])
    except (ValueError, KeyError, TypeError):
        return data[:200].decode(errors="replace")


def patch_progress(api: StatusApi, namespace: str, name: str, progress: Mapping[str, Any]) -> Any:
    """Merge ``progress`` into the DDPJob's status.progress (the one part of its status a worker may write).

    Args:
        api: The client (InClusterApi, or the ``kubernetes`` client's CustomObjectsApi).
        namespace: The DDPJob's namespace.
        name: The DDPJob's name.
        progress: The fields to merge; a None value removes its field.

    Returns:
        The client's answer: the DDPJob as stored (a dict from InClusterApi and the ``kubernetes`` client).

    Raises:
        ApiError: From InClusterApi, when the patch failed (another client raises its own errors).
    """
    return api.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, name, {"status": {"progress": progress}},
        _content_type=MERGE_PATCH,  # the kubernetes client's default is a JSON *patch*
        _request_timeout=REQUEST_TIMEOUT_SECONDS,
    )

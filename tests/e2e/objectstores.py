"""The e2e tier's S3 server: one SeaweedFS (tests/cluster/objectstore.py) for the session, on the address the real
nodes' pods reach (the node bridge's), with TLS from a CA of its own, so a job's spec.checkpoint.objectStore is
exercised as a user's would be: credentials from a Secret, the CA bundle from a ConfigMap. Started by the first run
that needs it; stopped at the session's end (tests/e2e/conftest.py)."""

from __future__ import annotations

import json
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

from tests.cluster.objectstore import S3Server, pod_reachable_host
from tests.cluster.pki import make_pki, serving_cert
from tests.conftest import Cluster

_lock = threading.Lock()
_server: S3Server | None = None
_ca: Path | None = None


def shared() -> tuple[S3Server, Path]:
    """The session's server and its CA certificate (started on first use)."""
    global _server, _ca
    with _lock:
        if _server is None:
            base = Path(tempfile.mkdtemp(prefix="ddpjob-e2e-s3-"))
            make_pki(base / "pki")
            host = pod_reachable_host()
            cert, key = serving_cert(base / "pki", "objectstore", (f"IP:{host}",))
            _server = S3Server.start(base / "s3", host=host, tls=(cert, key), ca=base / "pki" / "ca.crt")
            _ca = base / "pki" / "ca.crt"
        assert _ca is not None
        return _server, _ca


def stop() -> None:
    global _server
    with _lock:
        if _server is not None:
            _server.stop()
            _server = None


def store_objects(server: S3Server, ca: Path, ns: str) -> list[dict[str, Any]]:
    """The credentials Secret and the CA ConfigMap that store_spec's objectStore names, in ``ns``."""
    return [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3-credentials", "namespace": ns},
         "stringData": {"AWS_ACCESS_KEY_ID": server.access_key, "AWS_SECRET_ACCESS_KEY": server.secret_key}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "s3-ca", "namespace": ns},
         "data": {"ca.crt": ca.read_text()}},
    ]


def store_spec(server: S3Server, bucket: str) -> dict[str, Any]:
    """A job's spec.checkpoint.objectStore on ``server``'s ``bucket``, with store_objects' Secret and CA."""
    return {"endpoint": server.endpoint, "bucket": bucket, "credentialsSecret": "s3-credentials",
            "caBundle": {"configMap": "s3-ca"}}


def job_store(cluster: Cluster, ns: str) -> dict[str, Any]:
    """In ``ns``: the credentials Secret, the CA ConfigMap and a bucket of its own; returns the job's
    spec.checkpoint.objectStore."""
    server, ca = shared()
    bucket = server.bucket(f"e2e-{uuid.uuid4().hex[:10]}")
    items = store_objects(server, ca, ns)
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    return store_spec(server, bucket)


def uploaded(store: dict[str, Any], ns: str, job: str, client: Any = None) -> list[str]:
    """The checkpoints the job has in its bucket (the tier's unit records), as the test reads them; ``client``: an S3
    client of another server than the session's (S3Server.client)."""
    client = client or shared()[0].client()
    prefix = f"{ns}/{job}/units/"
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=store["bucket"], Prefix=prefix)
    from urllib.parse import unquote

    return sorted(unquote(o["Key"][len(prefix):].removesuffix(".json")) for page in pages
                  for o in page.get("Contents", []))

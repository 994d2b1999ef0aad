"""The checkpoint object-store tier's client (``spec.checkpoint.objectStore``): any S3-compatible endpoint, one bucket,
one key prefix per job. Checkpoints are uploaded in the background and restored when every pod starts fresh.

boto3 does the protocol (SigV4, multipart, retries, TLS): a well-kept client, never a hand-written S3. The runtime
is injected into users' images and otherwise needs only the standard library, so boto3 is imported lazily, inside
``ObjectStore``: importing this module never fails without it. The runtime image carries boto3 and its pure-Python
dependencies, pruned to S3, in ``vendor/`` beside ``lib/`` (the Dockerfile's runtime stage); when that directory
exists it goes first on ``sys.path``, so the injected runtime uses the boto3 it was tested with, not the image's.

Every failure is one ``ObjectStoreError`` that names the endpoint, bucket and key and the cause, with every
credential masked: its message may end up in the job's conditions and Events (``ddpjob_worker.redact``)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpjob_worker.redact import MASK, redact

ENDPOINT_ENV = "DDPJOB_OBJECT_STORE_ENDPOINT"
BUCKET_ENV = "DDPJOB_OBJECT_STORE_BUCKET"
PREFIX_ENV = "DDPJOB_OBJECT_STORE_PREFIX"
REGION_ENV = "DDPJOB_OBJECT_STORE_REGION"
ACCESS_KEY_ENV = "AWS_ACCESS_KEY_ID"
SECRET_KEY_ENV = "AWS_SECRET_ACCESS_KEY"
SESSION_TOKEN_ENV = "AWS_SESSION_TOKEN"
CA_BUNDLE_ENV = "AWS_CA_BUNDLE"

#: Where the runtime image keeps the vendored boto3: <runtime>/vendor next to <runtime>/lib/ddpjob_worker.
VENDOR_DIR = Path(__file__).resolve().parent.parent.parent / "vendor"
#: Parts of 16 MiB above 16 MiB, 4 at a time: bounded memory in a training pod; s3transfer raises the part size by
#: itself where a file would need more than S3's 10,000 parts.
PART_SIZE = 16 * 1024 * 1024
CONCURRENCY = 4
#: A dead endpoint is noticed in seconds; a slow one gets a minute per read before a retry.
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0
#: S3's own limit of keys per DeleteObjects request.
DELETE_BATCH = 1000
_MISSING = frozenset({"404", "NoSuchKey", "NotFound"})


class ObjectStoreError(Exception):
    """A failed object-store operation. ``code`` is S3's error code (``NoSuchKey``, ``AccessDenied``, ``404``) when
    the server answered, else None (a connection or TLS failure, a local file error)."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code

    @property
    def missing(self) -> bool:
        """The key (or the bucket) does not exist."""
        return self.code in _MISSING or self.code == "NoSuchBucket"


@dataclass(frozen=True, kw_only=True, slots=True)
class ObjectStoreConfig:
    """Where checkpoints go. Credentials are fields that ``repr`` leaves out: a config printed in a log or a
    traceback shows where, never how to get in."""

    endpoint: str
    bucket: str
    prefix: str = ""
    region: str = "us-east-1"
    #: A CA bundle (PEM) for an endpoint whose certificate a private CA signed; None: the default trust store.
    ca_bundle: str | None = None
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    #: Attempts per request (botocore's "standard" retries: throttling, 5xx and connection errors).
    max_attempts: int = 5

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ObjectStoreConfig | None:
        """The config the operator put into the pod's environment; None when no object store is configured."""
        endpoint = environ.get(ENDPOINT_ENV, "").strip()
        if not endpoint:
            return None
        bucket = environ.get(BUCKET_ENV, "").strip()
        if not bucket:
            raise ObjectStoreError(f"object store {endpoint}: {ENDPOINT_ENV} is set but {BUCKET_ENV} is not")
        return cls(
            endpoint=endpoint, bucket=bucket, prefix=environ.get(PREFIX_ENV, "").strip().strip("/"),
            region=environ.get(REGION_ENV, "").strip() or "us-east-1",
            ca_bundle=environ.get(CA_BUNDLE_ENV) or None, access_key_id=environ.get(ACCESS_KEY_ENV) or None,
            secret_access_key=environ.get(SECRET_KEY_ENV) or None, session_token=environ.get(SESSION_TOKEN_ENV) or None,
        )


def _code(e: BaseException) -> str | None:
    """S3's error code of a botocore ClientError; None for anything else."""
    code = getattr(e, "response", {}).get("Error", {}).get("Code")
    return str(code) if code is not None else None


def _boto3() -> Any:
    """boto3, from the runtime's vendored copy when there is one (see the module's docstring)."""
    if VENDOR_DIR.is_dir() and str(VENDOR_DIR) not in sys.path:
        sys.path.insert(0, str(VENDOR_DIR))
    try:
        import boto3
    except ImportError as e:
        raise ObjectStoreError(f"the object store needs boto3, which this Python cannot import ({e}); the injected "
                               f"runtime carries it in {VENDOR_DIR}, else `pip install ddpjob[objectstore]`") from None
    return boto3


class ObjectStore:
    """One bucket and prefix of an S3-compatible store; keys are relative to the prefix. Thread-safe (boto3 clients
    are), so one instance can serve a background uploader and the restore path."""

    def __init__(self, config: ObjectStoreConfig) -> None:
        self.config = config
        self._base = f"{config.prefix.strip('/')}/" if config.prefix.strip("/") else ""
        boto3 = _boto3()
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        options: dict[str, Any] = {
            "connect_timeout": CONNECT_TIMEOUT_S, "read_timeout": READ_TIMEOUT_S, "tcp_keepalive": True,
            "retries": {"max_attempts": config.max_attempts, "mode": "standard"}, "signature_version": "s3v4",
            # Path style: S3-compatible stores rarely have wildcard DNS for virtual-hosted bucket names.
            "s3": {"addressing_style": "path"}, "max_pool_connections": CONCURRENCY * 2, "user_agent_extra": "ddpjob",
        }
        if "request_checksum_calculation" in Config.OPTION_DEFAULTS:  # botocore >= 1.36: CRC checksums only where
            # S3 requires them; several S3-compatible stores refuse the checksum trailers sent by default.
            options |= dict.fromkeys(("request_checksum_calculation", "response_checksum_validation"), "when_required")
        session = boto3.session.Session(
            aws_access_key_id=config.access_key_id, aws_secret_access_key=config.secret_access_key,
            aws_session_token=config.session_token, region_name=config.region,
        )
        self._client = session.client("s3", endpoint_url=config.endpoint, verify=config.ca_bundle or True,
                                      config=Config(**options))
        self._transfer = TransferConfig(multipart_threshold=PART_SIZE, multipart_chunksize=PART_SIZE,
                                        max_concurrency=CONCURRENCY)

    def __repr__(self) -> str:
        return f"ObjectStore({self.config!r})"

    def _key(self, key: str) -> str:
        if not key or key.startswith("/"):
            raise self._error("address", repr(key), "a key must be relative and non-empty")
        return self._base + key

    def _error(self, op: str, key: str, cause: str, code: str | None = None) -> ObjectStoreError:
        """The error naming where ``op`` failed and why, with the config's credentials (and any other that
        ``redact`` recognises) masked."""
        for secret in (self.config.secret_access_key, self.config.session_token, self.config.access_key_id):
            if secret:
                cause = cause.replace(secret, MASK)
        where = f"object store {self.config.endpoint}, bucket {self.config.bucket}, key {key}"
        return ObjectStoreError(redact(f"{where}: {op} failed: {cause}"), code=code)

    @contextlib.contextmanager
    def _errors(self, op: str, key: str) -> Iterator[None]:
        """Turn any failure (botocore's, s3transfer's, the local file's) into one ObjectStoreError."""
        try:
            yield
        except ObjectStoreError:
            raise
        except Exception as e:
            raise self._error(op, key, f"{type(e).__name__}: {e}", _code(e)) from None

    def put_file(self, local_path: str | os.PathLike[str], key: str) -> None:
        """Upload a file, streamed from disk: multipart above PART_SIZE, never the whole file in memory."""
        full = self._key(key)
        with self._errors("upload", full):
            self._client.upload_file(os.fspath(local_path), self.config.bucket, full, Config=self._transfer)

    def get_file(self, key: str, local_path: str | os.PathLike[str]) -> None:
        """Download to a hidden temporary name in the destination's directory, fsync, rename: the file appears under
        its name only complete, whatever interrupts the download (a temporary file may stay, hidden)."""
        full, dest = self._key(key), Path(local_path)
        with self._errors("download", full):
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
            try:
                with os.fdopen(fd, "wb") as f:
                    self._client.download_fileobj(self.config.bucket, full, f, Config=self._transfer)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, dest)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            dirfd = os.open(dest.parent, os.O_RDONLY)
            try:
                os.fsync(dirfd)  # the rename itself survives a crash of the node
            finally:
                os.close(dirfd)

    def put_json(self, key: str, obj: Any) -> None:
        """Store a small JSON document (a manifest, a marker)."""
        full = self._key(key)
        body = json.dumps(obj, sort_keys=True).encode()
        with self._errors("put", full):
            self._client.put_object(Bucket=self.config.bucket, Key=full, Body=body, ContentType="application/json")

    def get_json(self, key: str) -> Any | None:
        """The JSON document at ``key``; None when there is none."""
        full = self._key(key)
        with self._errors("get", full):
            try:
                response = self._client.get_object(Bucket=self.config.bucket, Key=full)
            except Exception as e:
                if _code(e) in _MISSING:
                    return None
                raise
            return json.loads(response["Body"].read())

    def exists(self, key: str) -> bool:
        """Whether ``key`` exists (one HEAD request: no download)."""
        full = self._key(key)
        with self._errors("head", full):
            try:
                self._client.head_object(Bucket=self.config.bucket, Key=full)
            except Exception as e:
                if _code(e) in _MISSING:
                    return False
                raise
            return True

    def list_keys(self, prefix: str = "") -> list[str]:
        """Every key under ``prefix`` (relative, as given to put_*), sorted."""
        return sorted(self.list_ages(prefix))

    def list_ages(self, prefix: str = "") -> dict[str, float]:
        """Every key under ``prefix`` with the seconds since it was last written (the server's clock against
        this machine's: a garbage collector's margin must cover their skew)."""
        ages: dict[str, float] = {}
        now = time.time()
        with self._errors("list", self._base + prefix):
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.config.bucket,
                                                                           Prefix=self._base + prefix)
            for page in pages:
                for item in page.get("Contents", []):
                    ages[str(item["Key"])[len(self._base):]] = now - item["LastModified"].timestamp()
        return ages

    def delete(self, keys: Iterable[str]) -> None:
        """Delete keys, DELETE_BATCH per request; keys that do not exist are no error (as in S3)."""
        full = [self._key(k) for k in keys]
        for start in range(0, len(full), DELETE_BATCH):
            batch = full[start:start + DELETE_BATCH]
            with self._errors("delete", batch[0] if len(batch) == 1 else f"{batch[0]} (+{len(batch) - 1} more)"):
                response = self._client.delete_objects(
                    Bucket=self.config.bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True})
                if response.get("Errors"):  # S3 answers 200 and lists the keys it could not delete
                    error = response["Errors"][0]
                    raise self._error("delete", str(error.get("Key")), f"{error.get('Code')}: {error.get('Message')}",
                                      error.get("Code"))

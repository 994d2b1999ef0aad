"""spec.checkpoint: where checkpoints live (a claim, or each pod's own emptyDir), how what the script writes there is
replicated between the pods, and the object store that keeps them when every pod is lost (docs/checkpoints.md)."""

from __future__ import annotations

from ddpjob_worker.contract import RUNTIME_MOUNT_PATH
from pydantic import Field, model_validator

from ddpjob_operator.api.base import DNS_SUBDOMAIN as _DNS_SUBDOMAIN
from ddpjob_operator.api.base import Model as _Model

#: Paths a volume cannot be mounted at (the container runtime refuses them, or the container would break).
_FORBIDDEN_MOUNTS = ("/", "/proc", "/sys", "/dev", "/etc", "/bin", "/lib", "/usr", "/opt/venv", RUNTIME_MOUNT_PATH)
QUANTITY = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$"


class VolumeClaim(_Model):
    """A PVC the operator creates for checkpoints."""

    size: str = Field(default="10Gi", pattern=QUANTITY)
    storage_class_name: str | None = Field(default=None, pattern=_DNS_SUBDOMAIN)
    access_modes: tuple[str, ...] = ("ReadWriteOnce",)


class Replication(_Model):
    """Copies of what the script writes under mountPath in every other pod of the job (docs/checkpoints.md, "Your
    framework's checkpoints")."""

    enabled: bool | None = Field(default=None, description=(
        "Replicate the checkpoint folder between the pods; default: on when each pod has its own folder (no "
        "claim), off with a claim (the pods share it)."))
    max_bytes: str | None = Field(default=None, pattern=QUANTITY, description=(
        "Bytes of other pods' checkpoints one pod keeps at most (copies of the oldest checkpoints go first)."))
    sync_timeout_seconds: int = Field(default=300, ge=10, le=86400, description=(
        "How long a starting group waits at most for every pod to hold the newest complete checkpoint."))


class CaBundle(_Model):
    """A CA certificate the object store's TLS certificate is checked against."""

    config_map: str | None = Field(default=None, pattern=_DNS_SUBDOMAIN)
    secret: str | None = Field(default=None, pattern=_DNS_SUBDOMAIN)
    key: str = Field(default="ca.crt", pattern=r"^[-._a-zA-Z0-9]+$", max_length=253)

    @model_validator(mode="after")
    def _one_source(self) -> CaBundle:
        if (self.config_map is None) == (self.secret is None):
            raise ValueError("caBundle: set configMap or secret (the one that holds the CA certificate), not both")
        return self


class ObjectStore(_Model):
    """An S3-compatible object store the complete checkpoints are uploaded to, and restored from when every pod of
    the job starts fresh."""

    endpoint: str = Field(pattern=r"^https?://[^\s/]+(/.*)?$", max_length=2048, description=(
        "URL of the S3 API, e.g. https://s3.us-east-1.amazonaws.com or http://minio.storage:9000."))
    bucket: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", description="An existing bucket.")
    prefix: str = Field(default="", pattern=r"^([^/\s][^\s]*)?$", max_length=512, description=(
        "Key prefix; the job's objects go under <prefix><namespace>/<name>/."))
    region: str = Field(default="us-east-1", pattern=r"^[a-z0-9-]{1,64}$")
    credentials_secret: str = Field(pattern=_DNS_SUBDOMAIN, description=(
        "A Secret in the job's namespace with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and optionally "
        "AWS_SESSION_TOKEN); the workers get them as environment variables, never in logs, Events or status."))
    ca_bundle: CaBundle | None = None

    def job_prefix(self, namespace: str, name: str) -> str:
        """Where one job's checkpoints live in the bucket."""
        return f"{self.prefix}{namespace}/{name}/"


class Checkpoint(_Model):
    """Where checkpoints live: a PVC the operator creates, an existing claim, or each pod's own emptyDir (then what
    the script writes is replicated between the pods), and an optional object store."""

    mount_path: str = Field(default="/checkpoints", pattern=r"^/")
    volume_claim: VolumeClaim | None = None
    existing_claim: str | None = Field(default=None, pattern=_DNS_SUBDOMAIN)
    retain_on_delete: bool = Field(default=True, description="Keep the created PVC after the DDPJob is deleted.")
    keep: int = Field(default=3, ge=1, description="How many valid checkpoints the library keeps.")
    replication: Replication = Replication()
    object_store: ObjectStore | None = None

    @model_validator(mode="after")
    def _mount(self) -> Checkpoint:
        path = self.mount_path.rstrip("/") or "/"
        if any(path == bad or (bad != "/" and path.startswith(bad + "/")) for bad in _FORBIDDEN_MOUNTS):
            raise ValueError(f"mountPath: {self.mount_path!r} would hide a system or image directory; use a path of "
                             "its own such as /checkpoints")
        return self

    @property
    def keeps_created_claim(self) -> bool:
        """The operator creates the claim and keeps it after the job: it gets no ownerReference, so a DDPJob of the
        same name takes it back (and resumes from it)."""
        return self.volume_claim is not None and self.retain_on_delete

    @property
    def has_claim(self) -> bool:
        return self.volume_claim is not None or self.existing_claim is not None

    @property
    def replicates(self) -> bool:
        """Whether the pods copy what the script writes to each other: by default when each has its own folder."""
        enabled = self.replication.enabled
        return (not self.has_claim) if enabled is None else enabled

    @model_validator(mode="after")
    def _one_source(self) -> Checkpoint:
        if self.volume_claim is not None and self.existing_claim is not None:
            raise ValueError("set volumeClaim (the operator creates a PVC) or existingClaim, not both")
        return self

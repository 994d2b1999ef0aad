"""The object-store client (ddpjob_worker/objectstore.py) against a real S3-compatible server: SeaweedFS's weed,
built by hack/install-tools.sh and started by tests/cluster/objectstore.py. Round trips (a 50 MB multipart file,
JSON), listing, batched deletes, missing keys, refused credentials and TLS; a download cut off half-way; and the
runtime's vendored boto3, pruned by worker/vendor/prune.py, doing the same from a Python without site-packages.

Skipped, with the reason, where weed is not built. One server per module (plus one with TLS), on one xdist worker."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ddpjob_worker import objectstore
from ddpjob_worker.objectstore import ObjectStore, ObjectStoreConfig, ObjectStoreError
from ddpjob_worker.redact import redact

from tests.cluster.objectstore import S3Server, weed_binary
from tests.cluster.pki import make_pki, serving_cert

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.objectstore, pytest.mark.xdist_group("objectstore")]

MB = 1024 * 1024


def _weed_or_skip() -> None:
    if not weed_binary().exists():
        pytest.skip(f"SeaweedFS's weed is not built ({weed_binary()}): run hack/install-tools.sh")
    pytest.importorskip("boto3", reason="boto3 is not installed: the dev venv has it (pyproject's objectstore extra)")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    _weed_or_skip()
    with S3Server.start(tmp_path_factory.mktemp("s3")) as s:
        yield s


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[S3Server, Path]]:
    _weed_or_skip()
    pki = tmp_path_factory.mktemp("pki")
    make_pki(pki)
    cert, key = serving_cert(pki, "objectstore", ("IP:127.0.0.1", "DNS:localhost"))
    with S3Server.start(tmp_path_factory.mktemp("s3-tls"), tls=(cert, key), ca=pki / "ca.crt") as s:
        yield s, pki / "ca.crt"


def _config(server: S3Server, bucket: str, **overrides: Any) -> ObjectStoreConfig:
    fields: dict[str, Any] = {"endpoint": server.endpoint, "bucket": bucket, "prefix": "jobs/ns/train",
                              "access_key_id": server.access_key, "secret_access_key": server.secret_key}
    return ObjectStoreConfig(**(fields | overrides))


@pytest.fixture
def store(server: S3Server) -> ObjectStore:
    """A client on a fresh bucket, keys under the prefix a job would have."""
    return ObjectStore(_config(server, server.bucket(f"t-{uuid.uuid4().hex[:12]}")))


def _random_file(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    with path.open("wb") as f:
        for _ in range(size // MB):
            block = os.urandom(MB)
            f.write(block)
            digest.update(block)
    return digest.hexdigest()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(MB):
            digest.update(block)
    return digest.hexdigest()


def _no_secret(message: str, server: S3Server, *secrets: str) -> None:
    for secret in (server.secret_key, server.access_key, *secrets):
        assert secret not in message
    assert redact(message) == message, "the message holds something redact() would still mask"


@pytest.mark.timeout(180)
def test_a_large_file_round_trips_in_parts(store: ObjectStore, server: S3Server, tmp_path: Path) -> None:
    src = tmp_path / "model.pt"
    digest = _random_file(src, 50 * MB)
    store.put_file(src, "step-00000100/model.pt")
    head = server.client().head_object(Bucket=store.config.bucket, Key="jobs/ns/train/step-00000100/model.pt")
    assert head["ContentLength"] == 50 * MB
    assert head["ETag"].strip('"').endswith("-4"), f"not a 4-part multipart upload: {head['ETag']}"
    out = tmp_path / "restored" / "model.pt"
    out.parent.mkdir()
    store.get_file("step-00000100/model.pt", out)
    assert _sha256(out) == digest
    assert os.listdir(out.parent) == ["model.pt"], "a temporary file was left behind"


@pytest.mark.timeout(120)
def test_json_list_exists_and_batched_delete(store: ObjectStore, server: S3Server,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = {"step": 100, "files": ["model.pt", "optim.pt"], "sha256": "ab" * 32}
    keys = [f"step-{i:08d}/manifest.json" for i in (100, 200, 300)]
    for key in keys:
        store.put_json(key, manifest)
    store.put_json("latest.json", {"step": 300})
    assert store.get_json("step-00000100/manifest.json") == manifest
    assert store.list_keys() == ["latest.json", *keys]
    assert store.list_keys("step-000002") == ["step-00000200/manifest.json"]
    assert store.exists("latest.json") and not store.exists("latest")
    # Another prefix in the same bucket sees none of it.
    other = ObjectStore(_config(server, store.config.bucket, prefix="jobs/ns/other"))
    assert other.list_keys() == [] and other.get_json("latest.json") is None
    monkeypatch.setattr(objectstore, "DELETE_BATCH", 2)  # 4 keys (and one never written): 3 requests
    store.delete([*keys, "latest.json", "never-written.json"])
    assert store.list_keys() == []
    store.delete([])


@pytest.mark.timeout(60)
def test_a_missing_key(store: ObjectStore, tmp_path: Path) -> None:
    assert store.get_json("nothing.json") is None
    assert not store.exists("nothing.pt")
    with pytest.raises(ObjectStoreError) as caught:
        store.get_file("nothing.pt", tmp_path / "nothing.pt")
    assert caught.value.missing, caught.value
    assert "nothing.pt" in str(caught.value) and store.config.bucket in str(caught.value)
    assert os.listdir(tmp_path) == []
    for bad_key in ("", "/etc/passwd"):  # a caller's mistake is the same one error type
        with pytest.raises(ObjectStoreError, match="relative and non-empty"):
            store.put_json(bad_key, {})


@pytest.mark.timeout(60)
@pytest.mark.parametrize("wrong", ["secret", "access key"])
def test_wrong_credentials_are_refused_without_showing_them(store: ObjectStore, server: S3Server,
                                                            wrong: str) -> None:
    bad = f"Wrong{uuid.uuid4().hex}"
    overrides = {"secret_access_key": bad} if wrong == "secret" else {"access_key_id": bad}
    intruder = ObjectStore(_config(server, store.config.bucket, **overrides))
    for attempt in (lambda: intruder.put_json("x.json", {}), lambda: intruder.get_json("x.json"),
                    intruder.list_keys):
        with pytest.raises(ObjectStoreError) as caught:
            attempt()
        message = str(caught.value)
        assert server.endpoint in message and store.config.bucket in message
        assert caught.value.code in {"SignatureDoesNotMatch", "InvalidAccessKeyId", "AccessDenied"}, message
        _no_secret(message, server, bad)
    assert "secret" not in repr(intruder).lower() and bad not in repr(intruder)
    assert store.list_keys() == []


@pytest.mark.timeout(120)
def test_tls_with_the_ca_bundle_and_refused_without(tls_server: tuple[S3Server, Path]) -> None:
    server, ca = tls_server
    assert server.endpoint.startswith("https://")
    bucket = server.bucket("tls")
    ObjectStore(_config(server, bucket, ca_bundle=str(ca))).put_json("ok.json", {"tls": True})
    assert ObjectStore(_config(server, bucket, ca_bundle=str(ca))).get_json("ok.json") == {"tls": True}
    untrusting = ObjectStore(_config(server, bucket, max_attempts=1))
    with pytest.raises(ObjectStoreError) as caught:
        untrusting.get_json("ok.json")
    assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value) and caught.value.code is None
    _no_secret(str(caught.value), server)


#: A process that downloads and stops for good half-way: its file's writes stall once half of it is written.
_HALF_WAY = """
import io, os, sys, time
from ddpjob_worker.objectstore import ObjectStore, ObjectStoreConfig
half = int(sys.argv[3]) // 2
class Stalling(io.FileIO):
    written = 0
    def write(self, b):
        n = super().write(b)
        Stalling.written += n
        if Stalling.written >= half:
            print("half", flush=True)
            time.sleep(3600)
        return n
os.fdopen = lambda fd, mode="r", *a, **k: Stalling(fd, "wb")
ObjectStore(ObjectStoreConfig(**__import__("json").loads(sys.argv[1]))).get_file("big.bin", sys.argv[2])
"""


@pytest.mark.timeout(180)
def test_a_download_cut_off_half_way_leaves_no_file(store: ObjectStore, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "big.bin"
    _random_file(src, 40 * MB)
    store.put_file(src, "big.bin")
    dest_dir = tmp_path / "dest"
    dest_dir.mkdir()
    dest = dest_dir / "big.bin"
    # Killed: the destination name never appears; what was written sits under a hidden temporary name.
    c = store.config
    config = {"endpoint": c.endpoint, "bucket": c.bucket, "prefix": c.prefix, "access_key_id": c.access_key_id,
              "secret_access_key": c.secret_access_key}
    proc = subprocess.Popen([sys.executable, "-c", _HALF_WAY, json.dumps(config), str(dest), str(40 * MB)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "half"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not dest.exists()
    parts = [p for p in dest_dir.iterdir() if p.name.startswith(".big.bin.") and p.name.endswith(".part")]
    assert len(parts) == 1 and 0 < parts[0].stat().st_size <= 40 * MB, list(dest_dir.iterdir())
    # Failed in-process (a write error half-way): an ObjectStoreError, and neither file stays.
    parts[0].unlink()
    class Failing(io.FileIO):
        written = 0

        def write(self, b: Any) -> int:
            Failing.written += len(b)
            if Failing.written > 20 * MB:
                raise OSError(28, "No space left on device (simulated)")
            return super().write(b)

    def failing_fdopen(fd: int, *args: Any, **kwargs: Any) -> Failing:
        return Failing(fd, "wb")

    monkeypatch.setattr(os, "fdopen", failing_fdopen)
    with pytest.raises(ObjectStoreError, match="No space left on device"):
        store.get_file("big.bin", dest)
    monkeypatch.undo()
    assert list(dest_dir.iterdir()) == []


#: The runtime's layout (lib/ddpjob_worker, vendor/ beside it) in a Python without site-packages: the client must
#: find the vendored boto3 by itself, and botocore load only data files that prune.py keeps.
_VENDORED = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
from ddpjob_worker import objectstore
objectstore._boto3()  # puts vendor/ on sys.path, as ObjectStore() does: before botocore is imported, to record it all
import botocore.loaders as loaders
loaded = []
original = loaders.JSONFileLoader.load_file
def recording(self, path, *args, **kwargs):
    data = original(self, path, *args, **kwargs)
    if data is not None:
        loaded.append(os.path.relpath(path, os.path.dirname(os.path.dirname(loaders.__file__))))
    return data
loaders.JSONFileLoader.load_file = recording
from ddpjob_worker.objectstore import ObjectStore, ObjectStoreConfig, ObjectStoreError
import boto3, botocore
store = ObjectStore(ObjectStoreConfig(**json.loads(sys.argv[2])))
big = os.path.join(sys.argv[3], "part.bin")
with open(big, "wb") as f:
    f.write(os.urandom(20 * 1024 * 1024))
store.put_file(big, "v/part.bin")
store.get_file("v/part.bin", big + ".back")
assert open(big, "rb").read() == open(big + ".back", "rb").read()
store.put_json("v/m.json", {"a": 1})
assert store.get_json("v/m.json") == {"a": 1} and store.get_json("v/none") is None
assert store.list_keys("v/") == ["v/m.json", "v/part.bin"] and store.exists("v/m.json")
store.delete(["v/m.json", "v/part.bin"])
try:
    ObjectStore(ObjectStoreConfig(**{**json.loads(sys.argv[2]), "secret_access_key": "wrong"})).list_keys()
except ObjectStoreError as e:
    assert e.code == "SignatureDoesNotMatch", e
print(json.dumps({"boto3": boto3.__file__, "botocore": botocore.__file__, "sys.path": sys.path,
                  "loaded": sorted(set(loaded))}))
"""


def _installed(top: str) -> Path:
    spec = importlib.util.find_spec(top)
    assert spec is not None and spec.origin is not None, top
    origin = Path(spec.origin)
    return origin.parent if origin.name == "__init__.py" else origin


@pytest.mark.timeout(240)
def test_the_pruned_vendored_boto3_serves_the_client_alone(store: ObjectStore, tmp_path: Path) -> None:
    runtime = tmp_path / "runtime"
    shutil.copytree(REPO / "worker" / "ddpjob_worker", runtime / "lib" / "ddpjob_worker",
                    ignore=shutil.ignore_patterns("__pycache__"))
    vendor = runtime / "vendor"
    vendor.mkdir()
    for top in ("boto3", "botocore", "s3transfer", "jmespath", "urllib3", "dateutil", "six"):
        path = _installed(top)
        if path.is_dir():
            shutil.copytree(path, vendor / path.name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, vendor / path.name)
    prune = subprocess.run([sys.executable, str(REPO / "worker" / "vendor" / "prune.py"), str(vendor)],
                           capture_output=True, text=True, check=True)
    c = store.config
    config = {"endpoint": c.endpoint, "bucket": c.bucket, "prefix": c.prefix, "access_key_id": c.access_key_id,
              "secret_access_key": c.secret_access_key}
    # -I: no environment, no user site; -S: no site-packages at all, so only the vendored tree can serve.
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", _VENDORED, str(runtime / "lib"), json.dumps(config),
                           str(tmp_path)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"{prune.stdout}\n{proc.stderr[-4000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["boto3"].startswith(str(vendor)) and result["botocore"].startswith(str(vendor)), result
    # botocore asks for a file without its extension, and takes .json or .json.gz.
    kept = {str(p.relative_to(vendor)).removesuffix(".gz").removesuffix(".json")
            for p in (vendor / "botocore" / "data").rglob("*") if p.is_file()}
    assert set(result["loaded"]) <= kept, result["loaded"]
    print(prune.stdout, "\nloaded:", *result["loaded"], sep="\n")


def test_config_from_env_and_its_repr() -> None:
    assert ObjectStoreConfig.from_env({}) is None
    env = {objectstore.ENDPOINT_ENV: "https://s3.example:9000", objectstore.BUCKET_ENV: "ckpt",
           objectstore.PREFIX_ENV: "/jobs/ns/train/", objectstore.ACCESS_KEY_ENV: "AKIAIOSFODNN7EXAMPLE",
           objectstore.SECRET_KEY_ENV: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
           objectstore.SESSION_TOKEN_ENV: "tok3n", objectstore.CA_BUNDLE_ENV: "/etc/ca.pem"}
    config = ObjectStoreConfig.from_env(env)
    assert config is not None
    assert (config.endpoint, config.bucket, config.prefix, config.region, config.ca_bundle) == (
        "https://s3.example:9000", "ckpt", "jobs/ns/train", "us-east-1", "/etc/ca.pem")
    assert config.secret_access_key == env[objectstore.SECRET_KEY_ENV]
    for secret in ("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI", "tok3n"):
        assert secret not in repr(config) and secret not in str(config)
    with pytest.raises(ObjectStoreError, match=objectstore.BUCKET_ENV):
        ObjectStoreConfig.from_env({objectstore.ENDPOINT_ENV: "http://x"})


def test_the_module_imports_without_boto3() -> None:
    """The runtime imports it in users' images, where there may be no boto3: only ObjectStore() needs it."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from ddpjob_worker import objectstore as o\n"
            "try:\n    o.ObjectStore(o.ObjectStoreConfig(endpoint='http://x', bucket='b'))\n"
            "except o.ObjectStoreError as e:\n    print(e)")
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(REPO / "worker")], capture_output=True,
                          text=True, timeout=60, check=True)
    assert "needs boto3" in proc.stdout, proc.stdout + proc.stderr

"""Prune the runtime's vendored boto3 to what an S3 client loads: ``python3 prune.py DIR`` (DIR: a ``pip install
--target`` of requirements.txt). botocore ships the models of every AWS service (28 MB of its 30 MB); the injected
runtime is copied into each worker pod, so it keeps only S3's (and STS's: web-identity and assume-role credentials
call it). tests/worker/test_objectstore.py runs a client against a real S3 from a tree pruned by this file alone, in a
Python without site-packages. Standard library only: the Dockerfile's runtime stage runs it with the base's python3.

Also drops bytecode (the runtime ships none: the user's Python may be another minor version) and the test suites
some wheels include."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

#: Files directly under botocore/data that every client loads: endpoints and partitions (endpoint resolution), the
#: retry and the defaults-mode configuration.
BOTOCORE_DATA_FILES = ("_retry.json", "endpoints.json", "partitions.json", "sdk-default-configuration.json")
#: Service models kept, whole but for their examples (documentation only).
BOTOCORE_SERVICES = ("s3", "sts")
#: boto3's resource models: the runtime uses clients only; S3's is kept for a caller that wants ``resource("s3")``.
BOTO3_RESOURCES = ("s3",)


def prune(root: Path) -> list[str]:
    """Remove what an S3 client never loads from the tree at ``root``; returns the data files kept (relative)."""
    data = root / "botocore" / "data"
    if not data.is_dir():
        raise SystemExit(f"{data} is missing: is {root} a pip install --target of boto3?")
    for entry in data.iterdir():
        keep = entry.name in BOTOCORE_SERVICES if entry.is_dir() else entry.name in BOTOCORE_DATA_FILES
        if not keep:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    for examples in data.glob("*/*/examples-*.json"):
        examples.unlink()
    resources = root / "boto3" / "data"
    if resources.is_dir():
        for entry in resources.iterdir():
            if entry.name not in BOTO3_RESOURCES:
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    for junk in [*root.rglob("__pycache__"), *root.glob("*/tests")]:
        shutil.rmtree(junk, ignore_errors=True)
    return sorted(str(p.relative_to(root)) for p in data.rglob("*") if p.is_file())


def size(root: Path) -> int:
    """Bytes of the files under ``root`` (apparent size: what a copy into an emptyDir writes)."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


if __name__ == "__main__":
    target = Path(sys.argv[1])
    before = size(target)
    kept = prune(target)
    print(f"pruned {target}: {before / 1e6:.1f} MB -> {size(target) / 1e6:.1f} MB; botocore/data keeps "
          + ", ".join(kept))

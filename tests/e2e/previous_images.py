"""The previous release's operator and runtime images, built from that commit's own tree (its Dockerfile, operator/
and worker/) with the wheels hack/images.sh downloaded, and put into the real nodes: what a cluster upgraded from
that release runs before the upgrade. Tagged ``prev-<commit>`` (both releases say appVersion 0.1.0, so the tag is
what tells them apart); BuildKit reuses every layer of the dependencies, so a build takes tens of seconds."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e import training as t
from tests.previous_release import extract

CACHE = Path(os.environ.get("DDPJOB_CACHE", Path.home() / ".cache" / "ddpjob"))
#: hack/images.sh's base: the official image when Docker has it, else its offline stand-in under its own name.
BASES = ("python:3.11-slim-bookworm", "ddpjob-local/python:3.11-slim-bookworm")


#: hack/images.sh's client: Debian's, whose BuildKit is built in, where it is installed (another `docker` first on
#: PATH may lack the buildx plugin that BuildKit needs; the Dockerfile's wheelhouse mount needs BuildKit).
DOCKER = "/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker"


def _docker(*args: str, timeout: float = 900) -> str:
    proc = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, "DOCKER_BUILDKIT": "1"})
    assert proc.returncode == 0, (f"docker {' '.join(args[:6])}...: exit {proc.returncode}\n"
                                  f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def _exists(image: str) -> bool:
    return subprocess.run([DOCKER, "image", "inspect", image], capture_output=True, check=False).returncode == 0


def _link_wheels(source: Path, dest: Path) -> None:
    wheels = sorted(source.glob("*.whl"))
    if not wheels:
        pytest.fail(f"no wheels in {source}: run `bash hack/images.sh` first")
    dest.mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        os.link(wheel, dest / wheel.name)


def _build(rev: str, operator: str, runtime: str) -> None:
    base = next((b for b in BASES if _exists(b)), None)
    if base is None:
        pytest.fail(f"none of {BASES} in Docker: run `bash hack/images.sh` first")
    common = ["--build-arg", f"BASE_IMAGE={base}", "--build-arg", "PIP_ARGS=--no-index"]
    ctx, runtime_ctx = CACHE / "previous-context", CACHE / "previous-runtime-context"
    for folder in (ctx, runtime_ctx):
        shutil.rmtree(folder, ignore_errors=True)
    extract(rev, ctx)
    _link_wheels(CACHE / "wheelhouse", ctx / "hack" / "wheelhouse")
    _docker("build", "-q", "-t", operator, "--target", "operator", *common, str(ctx))
    # As hack/images.sh builds it: a context of worker/ and the runtime's vendored wheels only.
    runtime_ctx.mkdir(parents=True)
    shutil.copytree(ctx / "worker", runtime_ctx / "worker")
    shutil.copy(ctx / ".dockerignore", runtime_ctx / ".dockerignore")
    _link_wheels(CACHE / "wheelhouse-runtime", runtime_ctx / "hack" / "wheelhouse")
    _docker("build", "-q", "-t", runtime, "--target", "runtime", *common, "-f", str(ctx / "Dockerfile"),
            str(runtime_ctx))


def _drop_superseded(keep: str) -> None:
    """Earlier prev-* tags (another previous release): only the newest is kept."""
    for repo in ("ddpjob-operator", "ddpjob-runtime"):
        tags = _docker("images", "--format", "{{.Tag}}", repo).split()
        old = [f"{repo}:{tag}" for tag in tags if tag.startswith("prev-") and tag != keep]
        if old:
            subprocess.run([DOCKER, "rmi", *old], capture_output=True, check=False)


def _import_everywhere(cluster_dir: Path, images: tuple[str, ...], tmp: Path) -> None:
    """Into every real node's containerd, each on its own: node_images.share (hard links of node 0's store) is
    refused once pods have run, and this test comes after the whole tier. The images are small (~300 MB together,
    mostly the base layers), so one tarball imported node by node takes seconds."""
    from tests.cluster.node import NodeState, _ctr

    ns = NodeState.load(cluster_dir.resolve())
    assert ns is not None, f"no real node in {cluster_dir}"
    tar = tmp / "previous-images.tar"
    _docker("save", "-o", str(tar), *images)
    try:
        for k in range(ns.nodes):
            _ctr(ns, "images", "import", str(tar), node=k)
    finally:
        tar.unlink(missing_ok=True)


def previous_images(rev: str, cluster_dir: Path, tmp: Path) -> tuple[str, str]:
    """(operator image, runtime image) of ``rev``, built unless Docker has them, and imported into the real nodes."""
    tag = f"prev-{rev[:12]}"
    operator, runtime = f"ddpjob-operator:{tag}", f"ddpjob-runtime:{tag}"
    t0 = time.monotonic()
    if not (_exists(operator) and _exists(runtime)):
        _build(rev, operator, runtime)
        t.log(f"{operator} and {runtime} built from {rev[:12]}'s tree ({time.monotonic() - t0:.0f}s)")
    _drop_superseded(tag)
    t1 = time.monotonic()
    _import_everywhere(cluster_dir, (operator, runtime), tmp)
    t.log(f"{operator} and {runtime} imported into the real nodes ({time.monotonic() - t1:.0f}s)")
    return operator, runtime

"""Issue 44 #1-#3: what `make images` built and `make dist` packed, pushed to a real OCI registry (CNCF
distribution's `registry`, built from its Go module like the cluster tools) the way a platform team publishes it:
`REGISTRY=... make push` for the images, `helm push` for the chart; then read back from that registry alone: the
images pull to the same image IDs, and the chart from `oci://` renders with the one value `imageRegistry` to
references the registry holds. In the images tier (Docker, the built images); the operator and runtime images only
(~300 MB): the worker image's ~6 GB push would be minutes of disk for the same code path."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.cluster.controlplane import free_port, tool
from tests.cluster.registry import answers, serve
from tests.conftest import wait_for
from tests.images.test_images import docker, skip_unless_built

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CHART = yaml.safe_load((REPO / "charts" / "ddpjob-operator" / "Chart.yaml").read_text())
APP = CHART["appVersion"]
PATH = "ml/team"  # a path under the host, as registry.example.com/ml/team


@pytest.fixture(scope="module", autouse=True)
def images() -> None:
    skip_unless_built(("ddpjob-operator:dev", "ddpjob-runtime:dev"), "make images")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A registry on a loopback port (Docker and Helm talk plain HTTP to 127.0.0.0/8); its host:port."""
    root = tmp_path_factory.mktemp("registry")
    port = free_port()
    proc = serve(root, "registry", f"127.0.0.1:{port}", delete=True)
    try:
        wait_for(lambda: answers(f"http://127.0.0.1:{port}/v2/"), timeout=30,
                 describe="the registry answering /v2/", state=lambda: (root / "registry.log").read_text())
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(root / "data", ignore_errors=True)


def _get(url: str, accept: str = "") -> bytes | None:
    """The body of a 2xx answer; None for an error status or no answer."""
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            body: bytes = resp.read()
            return body
    except OSError:
        return None


def test_make_push_publishes_the_images_and_they_pull_back_the_same(registry: str) -> None:
    target = f"{registry}/{PATH}"
    env = {**os.environ, "REGISTRY": target, "IMAGES": "operator runtime"}
    env.pop("TAG", None)
    proc = subprocess.run(["make", "--no-print-directory", "push"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"--set imageRegistry={target}" in proc.stdout, proc.stdout
    for image in ("ddpjob-operator", "ddpjob-runtime"):
        listed = _get(f"http://{registry}/v2/{PATH}/{image}/tags/list")
        assert listed and APP in json.loads(listed)["tags"], listed
        ref = f"{target}/{image}:{APP}"
        local = docker("image", "inspect", "-f", "{{.Id}}", f"{image}:dev").stdout.strip()
        docker("rmi", ref)  # only the tag: the image stays as :dev; the pull must come from the registry
        docker("pull", "-q", ref, timeout=300)
        try:
            assert docker("image", "inspect", "-f", "{{.Id}}", ref).stdout.strip() == local
        finally:
            docker("rmi", ref, check=False)


def test_the_chart_from_oci_renders_with_one_value_to_images_the_registry_holds(
    registry: str, tmp_path: Path
) -> None:
    helm = str(tool("helm"))
    proc = subprocess.run(["make", "--no-print-directory", "dist", f"DIST={tmp_path}"], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    archive = tmp_path / f"ddpjob-operator-{CHART['version']}.tgz"
    pushed = subprocess.run([helm, "push", str(archive), f"oci://{registry}/{PATH}/charts", "--plain-http"],
                            capture_output=True, text=True, timeout=120, check=False)
    assert pushed.returncode == 0, pushed.stderr
    oci = f"oci://{registry}/{PATH}/charts/ddpjob-operator"
    shown = subprocess.run([helm, "show", "chart", oci, "--version", CHART["version"], "--plain-http"],
                           capture_output=True, text=True, timeout=120, check=True).stdout
    assert yaml.safe_load(shown)["version"] == CHART["version"]
    rendered = subprocess.run(
        [helm, "template", "ddpjob-operator", oci, "--version", CHART["version"], "--plain-http",
         "--kube-version=1.30.0", "--set", f"imageRegistry={registry}/{PATH}"],
        capture_output=True, text=True, timeout=120, check=True).stdout
    deploy = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment")
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"{registry}/{PATH}/ddpjob-operator:{APP}"
    assert f"--runtime-image={registry}/{PATH}/ddpjob-runtime:{APP}" in container["args"]
    # Both references resolve in the registry (the test above pushed them).
    for image in ("ddpjob-operator", "ddpjob-runtime"):
        manifest = _get(f"http://{registry}/v2/{PATH}/{image}/manifests/{APP}",
                        accept="application/vnd.docker.distribution.manifest.v2+json")
        assert manifest is not None, f"{image}:{APP} not in the registry"

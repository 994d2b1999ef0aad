"""Issue 44 #5: an install of the chart before the CRD's last change, upgraded to this tree's chart with the command
docs/lifecycle.md gives, as written: the CRD's newest field is served afterwards, the DDPJob created before is the
same object, the values given at install are kept, and `helm uninstall` keeps the CRD and the job.

kwok runs no containers: that the job's pods keep training through the operator's rollout is the e2e soak's
(tests/e2e/test_soak.py kills the leading operator mid-training)."""

from __future__ import annotations

import io
import json
import re
import shlex
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import Cluster, wait_for
from tests.integration.helm import CHART, CRD, RELEASE, Helm
from tests.integration.operator_support import CRD_PATH

REPO = Path(__file__).resolve().parents[2]
CRD_SOURCE = str(CRD_PATH.relative_to(REPO))


def git(*args: str) -> bytes:
    proc = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, check=False)
    if proc.returncode != 0:
        pytest.fail(f"git {' '.join(args)}: {proc.stderr.decode().strip()} (this test needs the repository's "
                    "history: in a shallow clone run `git fetch --unshallow`)")
    return proc.stdout


def _fields_at(rev: str) -> set[str] | None:
    """The CRD source's field paths at ``rev``; None where the file is not at that path (before it moved there)."""
    proc = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{CRD_SOURCE}"], capture_output=True, check=False)
    return field_paths(yaml.safe_load(proc.stdout)) if proc.returncode == 0 else None


def previous_chart(dest: Path) -> tuple[str, Path]:
    """The chart as of the commit before the last change to the CRD's fields: (that commit, its chart folder). A
    change of descriptions only adds no field to look for, so it does not count."""
    rev = ""
    for last in git("log", "--format=%H", "--", CRD_SOURCE).decode().split():
        rev = git("rev-parse", f"{last}^").decode().strip()
        before = _fields_at(rev)
        if before is None or before != _fields_at(last):
            break
    assert rev, f"{CRD_SOURCE} has no history"
    with tarfile.open(fileobj=io.BytesIO(git("archive", rev, "charts/ddpjob-operator"))) as tar:
        tar.extractall(dest, filter="data")
    return rev, dest / "charts" / "ddpjob-operator"


def field_paths(crd: dict[str, Any]) -> set[str]:
    """Every property path of the served version's schema, e.g. "spec.networkPolicy"."""
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    out: set[str] = set()

    def walk(node: dict[str, Any], prefix: str) -> None:
        for name, sub in node.get("properties", {}).items():
            path = f"{prefix}{name}"
            out.add(path)
            walk(sub, f"{path}.")

    walk(schema, "")
    return out


def docs_upgrade_command(namespace: str, chart: Path) -> list[str]:
    """docs/lifecycle.md's `helm upgrade` line, pointed at this test's namespace and chart."""
    text = (REPO / "docs" / "lifecycle.md").read_text()
    section = text.split("## Upgrade", 1)[1]
    line = next(ln for ln in section.splitlines() if ln.startswith("helm upgrade "))
    words = shlex.split(line)
    assert "charts/ddpjob-operator" in words and "ddpjob-system" in words, line
    return [str(chart) if w == "charts/ddpjob-operator" else namespace if w == "ddpjob-system" else w
            for w in words[1:]]


def served(cluster: Cluster, path: str) -> bool:
    """Whether the API server's published schema has the field (what `kubectl explain` reads)."""
    return cluster.kubectl("explain", f"ddpjobs.{path}", check=False).returncode == 0


@pytest.fixture
def restore_crd(cluster: Cluster) -> Iterator[None]:
    """The tier's CRD as conftest applies it, whatever this test left."""
    yield
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_PATH))


def test_helm_upgrade_from_the_chart_before_the_crds_last_change(
    cluster: Cluster, ddpjob_crd: str, namespace: str, tmp_path: Path, restore_crd: None
) -> None:
    helm = Helm(cluster)
    rev, old_chart = previous_chart(tmp_path)
    old_crd_file = next(old_chart.glob("*/ddpjob-crd.yaml"))
    old_fields = field_paths(yaml.safe_load(old_crd_file.read_text()))
    new_fields = field_paths(yaml.safe_load(CRD_PATH.read_text())) - old_fields
    assert new_fields, f"the CRD at {rev} has every field of this tree's"
    newest = min(new_fields, key=lambda p: (p.count("."), p))

    # The cluster as that chart left it: its CRD (replace: no Helm ownership, as crds/ installs it), its release.
    cluster.kubectl("replace", "-f", str(old_crd_file))
    wait_for(lambda: not served(cluster, newest), timeout=60, describe=f"{newest} no longer served (CRD of {rev})")
    helm("install", RELEASE, str(old_chart), "--namespace", namespace, "--set", "image.tag=dev")
    job = cluster.kubectl("create", "-n", namespace, "-o", "json", "-f", "-", stdin=yaml.safe_dump({
        "apiVersion": "ddpjob.io/v1alpha1", "kind": "DDPJob", "metadata": {"name": "before"},
        "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "worker", "image": "w:1",
                                                                       "args": ["torchrun", "t.py"]}]}}},
    })).stdout
    uid = json.loads(job)["metadata"]["uid"]

    upgrade = docs_upgrade_command(namespace, CHART)
    if (old_chart / "crds").is_dir() and "--take-ownership" in upgrade:
        # What the docs' flag is for: without it Helm refuses to adopt the CRD that crds/ created.
        plain = helm(*[w for w in upgrade if w != "--take-ownership"], check=False)
        assert plain.returncode != 0 and "invalid ownership metadata" in plain.stderr, plain.stderr
    helm(*upgrade)

    wait_for(lambda: served(cluster, newest), timeout=60, describe=f"{newest} served after helm upgrade")
    crd = json.loads(cluster.kubectl("get", "crd", CRD, "-o", "json").stdout)
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert crd["metadata"]["annotations"]["meta.helm.sh/release-namespace"] == namespace
    after = json.loads(cluster.kubectl("get", "ddpjob", "before", "-n", namespace, "-o", "json").stdout)
    assert after["metadata"]["uid"] == uid, "the job created before the upgrade is the same object"
    image = json.loads(cluster.kubectl("get", "deployment", RELEASE, "-n", namespace, "-o", "json").stdout)[
        "spec"]["template"]["spec"]["containers"][0]["image"]
    assert re.fullmatch(r".*ddpjob-operator:dev", image), f"the value given at install kept: {image}"
    chart = json.loads(helm("status", RELEASE, "--namespace", namespace, "-o", "json").stdout)
    assert chart["version"] == 2

    helm("uninstall", RELEASE, "--namespace", namespace, "--wait", "--timeout=120s")
    assert served(cluster, newest), "helm uninstall keeps the CRD"
    cluster.kubectl("get", "ddpjob", "before", "-n", namespace)

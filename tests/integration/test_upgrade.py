"""Issue 44 #5: an install of the chart before the CRD's last change, upgraded to this tree's chart with the command
docs/lifecycle.md gives, as written: the CRD's newest field is served afterwards, the DDPJob created before is the
same object, the values given at install are kept, and `helm uninstall` keeps the CRD and the job.

kwok runs no containers: that a job keeps training through the same upgrade, images included, is
tests/e2e/test_upgrade.py's, on real nodes."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import Cluster, wait_for
from tests.integration.helm import ADOPT_CRD, CHART, CRD, RELEASE, Helm
from tests.integration.operator_support import CRD_PATH
from tests.previous_release import docs_upgrade_command, newest_field, previous_chart, served


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
    newest = newest_field(old_chart)

    # The cluster as that chart left it: its CRD (replace: no Helm ownership, as crds/ installs it), its release. A
    # chart whose CRD is a release resource (0.4.0 on) would have made it itself; here the tier's CRD exists, so its
    # release takes it over (the old schema first, so the take-over changes only the ownership).
    cluster.kubectl("replace", "-f", str(old_crd_file))
    wait_for(lambda: not served(cluster, newest), timeout=60, describe=f"{newest} no longer served (CRD of {rev})")
    adopt = () if (old_chart / "crds").is_dir() else ADOPT_CRD
    helm("install", RELEASE, str(old_chart), "--namespace", namespace, "--set", "image.tag=dev", *adopt)
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

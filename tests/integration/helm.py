"""The pinned helm binary pointed at a test cluster (tests/integration/test_packaging.py, test_upgrade.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import Cluster

#: The chart under test, the release name its tests install it as (so resource names are just "ddpjob-operator"),
#: and the CRD it ships.
CHART = Path(__file__).resolve().parents[2] / "charts" / "ddpjob-operator"
RELEASE = "ddpjob-operator"
CRD = "ddpjobs.ddpjob.io"

#: The tier's CRD is applied by conftest (`kubectl apply --server-side`), not by a release, as on a cluster whose
#: CRD came from chart 0.3.0's crds/ or from manifests/install.yaml: a release adopts it (Helm >= 3.17).
ADOPT_CRD = ("--take-ownership",)


class Helm:
    """The pinned helm binary pointed at the test cluster."""

    def __init__(self, cluster: Cluster) -> None:
        from tests.cluster.controlplane import tool

        self.binary = tool("helm")
        self.cluster = cluster

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(self.binary), f"--kubeconfig={self.cluster.kubeconfig}", *args],
                              capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

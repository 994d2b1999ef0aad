"""`make dist` (issue 44 #2): the wheel a user installs into a fresh venv gives a working `kubectl ddpjob`, and the
chart archive is the chart, versioned, one `helm push` away from an OCI registry. In the images tier: it builds
what ships, as the image tests do, and pip fetches the wheel's dependencies (~40 s)."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CHART = yaml.safe_load((REPO / "charts" / "ddpjob-operator" / "Chart.yaml").read_text())


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(["make", "--no-print-directory", "dist", f"DIST={out}"], cwd=REPO, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def test_the_wheel_in_a_fresh_venv_gives_kubectl_ddpjob(dist: Path, tmp_path: Path) -> None:
    wheels = list(dist.glob("ddpjob-*-py3-none-any.whl"))
    assert len(wheels) == 1, list(dist.iterdir())
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheels[0])],
                         capture_output=True, text=True, timeout=600, check=False)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "120"}
    helped = subprocess.run(["kubectl-ddpjob", "--help"], capture_output=True, text=True, env=env, timeout=60,
                            check=False)
    assert helped.returncode == 0 and "describe" in helped.stdout and "list" in helped.stdout, helped
    # kubectl itself finds it on the PATH, as `kubectl ddpjob`.
    plugins = subprocess.run(["kubectl", "plugin", "list", "--name-only"], capture_output=True, text=True, env=env,
                             timeout=60, check=False)
    assert "kubectl-ddpjob" in plugins.stdout, plugins
    # No torch came with it: the operator's and the plugin's dependencies only.
    listed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
                            capture_output=True, text=True, timeout=60, check=True).stdout
    assert "torch==" not in listed, listed


def test_the_chart_archive_is_the_chart_at_its_version(dist: Path) -> None:
    archive = dist / f"ddpjob-operator-{CHART['version']}.tgz"
    assert archive.exists(), list(dist.iterdir())
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    for path in ("Chart.yaml", "values.yaml", "values.schema.json", "files/ddpjob-crd.yaml", "templates/crd.yaml",
                 "templates/deployment.yaml", "templates/userroles.yaml"):
        assert f"ddpjob-operator/{path}" in names, sorted(names)

"""The kubectl install path of docs/packaging.md and docs/lifecycle.md, run as written on the session's real nodes:
`kubectl apply -f manifests/install.yaml` on a cluster without the operator or its CRD, the first example trained
to the end (followed with `kubectl ddpjob describe --watch`, as the docs say), then `kubectl delete -f
manifests/install.yaml` and what docs/lifecycle.md says stays and goes. The Helm path is every other e2e test's
(tests/e2e/conftest.py, `env`).

Last in the session (marker ``uninstalls``): it removes the session's Helm release and the CRD, and with the CRD
every DDPJob."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import wait_for
from tests.e2e import training as t
from tests.e2e.background import Background
from tests.e2e.runs import Env, fresh_namespace

pytestmark = pytest.mark.timeout(900)

INSTALL = t.REPO / "manifests" / "install.yaml"
EXAMPLE = t.REPO / "manifests" / "examples" / "cpu-charlm.yaml"


@pytest.mark.uninstalls
def test_install_manifest_as_written_trains_the_first_example(env: Env, background: Background) -> None:
    background.drain()
    cluster = env.cluster
    t.remove_helm_install(cluster)

    t0 = time.monotonic()
    cluster.kubectl("apply", "-f", str(INSTALL))
    cluster.kubectl("-n", t.OPERATOR_NS, "rollout", "status", f"deployment/{t.RELEASE}", "--timeout=180s")
    t.log(f"kubectl apply -f manifests/install.yaml: operator Ready in {time.monotonic() - t0:.0f}s")

    ns = fresh_namespace(cluster, "install")
    try:
        t1 = time.monotonic()
        cluster.kubectl("apply", "-n", ns, "-f", str(EXAMPLE))
        # The docs' way to follow it; --watch returns when the job has finished.
        watched = cluster.ddpjob("describe", "charlm", "-n", ns, "--watch", timeout=600)
        job = json.loads(cluster.kubectl("get", "ddpjob", "charlm", "-n", ns, "-o", "json").stdout)
        status = job.get("status") or {}
        assert status.get("state") == "Succeeded", (status, watched.stdout[-3000:])
        assert "Succeeded" in watched.stdout, watched.stdout[-3000:]
        progress = status.get("progress") or {}
        assert progress.get("globalStep") == progress.get("totalSteps") and progress.get("totalSteps"), progress
        t.log(f"manifests/examples/cpu-charlm.yaml as written: Succeeded in {time.monotonic() - t1:.0f}s at "
              f"global step {progress.get('globalStep')}, last checkpoint {progress.get('lastCheckpoint')}")

        # Uninstall as docs/lifecycle.md says: the CRD goes, and with it every DDPJob and (by their owner
        # references) their pods; the namespace's worker identity stays (it is the namespace's, not a job's).
        cluster.kubectl("delete", "-f", str(INSTALL), "--wait=true", "--timeout=180s")
        wait_for(lambda: t.gone(cluster, "namespace", t.OPERATOR_NS) and t.gone(cluster, "crd", t.CRD)
                 and t.gone(cluster, "pods", namespace=ns), timeout=180,
                 describe="operator namespace, CRD and the job's pods gone after kubectl delete -f install.yaml",
                 state=lambda: cluster.kubectl("get", "pods", "-n", ns, "-o", "wide", check=False).stdout)
        assert t.gone(cluster, "clusterrole,clusterrolebinding", "-l", f"app.kubernetes.io/instance={t.RELEASE}")
        kept = cluster.kubectl("get", "sa,role,rolebinding", "-n", ns, "-l",
                               "app.kubernetes.io/component=worker-identity", "-o", "name").stdout.split()
        assert len(kept) == 3, kept
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)

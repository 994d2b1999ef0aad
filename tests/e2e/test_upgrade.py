"""Issue 44 #5 on real nodes: the previous release (the chart of the commit before the CRD's last field change,
with that commit's own operator and runtime images) installed; a job started under it; docs/lifecycle.md's `helm
upgrade` line run as written to this tree's chart, with the new images, while the job trains. The newest CRD field
is served afterwards, the job keeps running through the operator's rollout (the same worker pods, no restart, no
incident), the new operator then replaces a deleted worker (a job of two runtime versions: the survivor keeps the
old one, the replacement gets the new), and the job ends bitwise equal to the uninterrupted run.

Both releases say appVersion 0.1.0, so the images' tags tell them apart: the old install sets them to the old
images (what its appVersion would name), the upgrade to this tree's (what the new appVersion would name).

Last in the session (marker ``uninstalls``): it replaces the session's Helm release and the CRD."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cluster, wait_for
from tests.e2e import faults
from tests.e2e import training as t
from tests.e2e.background import Background
from tests.e2e.previous_images import previous_images
from tests.e2e.runs import JOB, Env, assert_same_model, run_job
from tests.previous_release import docs_upgrade_command, newest_field, previous_chart, served

pytestmark = pytest.mark.timeout(1500)

def _helm(cluster: Cluster, *args: str) -> None:
    proc = subprocess.run([t.helm(), *args, "--kubeconfig", str(cluster.kubeconfig), "--wait", "--timeout", "5m"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"helm {' '.join(args)}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"


def _runtime_images(cluster: Cluster, ns: str) -> dict[str, tuple[str, str]]:
    """Worker pod name -> (uid, the runtime image its init container copied)."""
    out = {}
    for pod in t.worker_pods(cluster, ns, JOB):
        if "-worker-" not in pod["metadata"]["name"]:  # the rendezvous pod carries the job's label too
            continue
        images = [c["image"] for c in pod["spec"].get("initContainers", []) if "ddpjob-runtime:" in c["image"]]
        out[pod["metadata"]["name"]] = (pod["metadata"]["uid"], images[0] if images else "")
    return out


def _restarts(cluster: Cluster, ns: str) -> int:
    return sum(int(c.get("restartCount", 0)) for pod in t.worker_pods(cluster, ns, JOB)
               for c in (pod.get("status") or {}).get("containerStatuses", []))


def _operator_images(cluster: Cluster) -> set[str]:
    pods = t.get_json(cluster, "pods", "-n", t.OPERATOR_NS, "-l", "app.kubernetes.io/component=operator")["items"]
    return {c["image"] for pod in pods for c in pod["spec"]["containers"]}


def _upgrade_scenario(old_runtime: str, newest: str) -> Any:
    def scenario(env: Env, ns: str, t0: float) -> dict[str, Any]:
        cluster = env.cluster
        capture = faults.LogCapture(cluster, ns)
        faults.wait_quiet(cluster, ns, after_checkpoint=0)
        before = t.job_status(cluster, ns, JOB)
        pods = _runtime_images(cluster, ns)
        assert {image for _, image in pods.values()} == {old_runtime}, pods
        step = (before.get("progress") or {}).get("globalStep")

        u0 = time.monotonic()
        upgrade = docs_upgrade_command(t.OPERATOR_NS, t.CHART)
        _helm(cluster, *upgrade, "--set", f"image.tag={t.APP_VERSION}", "--set", f"runtimeImage.tag={t.APP_VERSION}")
        cluster.kubectl("-n", t.OPERATOR_NS, "rollout", "status", f"deployment/{t.RELEASE}", "--timeout=180s")
        took = time.monotonic() - u0
        wait_for(lambda: _operator_images(cluster) == {t.OPERATOR_IMAGE}, timeout=120,
                 describe=f"only {t.OPERATOR_IMAGE} runs", state=lambda: str(_operator_images(cluster)))
        assert served(cluster, newest), f"{newest} not served after helm upgrade"
        during = t.job_status(cluster, ns, JOB)
        after_step = (during.get("progress") or {}).get("globalStep")
        t.log(f"helm upgrade to this tree's chart while {JOB} trained: {took:.0f}s, global step {step} -> "
              f"{after_step}, {newest} served")
        assert during.get("state") == "Running" and not during.get("incidentCount"), during
        assert _runtime_images(cluster, ns) == pods, "the worker pods are the ones from before the upgrade"
        assert _restarts(cluster, ns) == 0

        # The new operator leads (the Lease is held by one of its pods), and training went on past a checkpoint
        # written since the upgrade; then its first recovery, in a job whose pods run the old runtime.
        now = set(t.operator_pods(cluster))
        wait_for(lambda: faults.holder_pod(faults.leader(cluster)) in now, timeout=120,
                 describe=f"the Lease held by one of {sorted(now)}", state=lambda: faults.leader(cluster))
        faults.wait_quiet(cluster, ns, after_checkpoint=int(
            ((during.get("progress") or {}).get("lastCheckpoint") or {}).get("step") or 0))
        at_fault = (t.job_status(cluster, ns, JOB).get("progress") or {}).get("globalStep")
        assert _runtime_images(cluster, ns) == pods and _restarts(cluster, ns) == 0
        capture()
        faults.delete("worker-1")(cluster, ns)
        capture()
        faults.wait_incidents(cluster, ns, 1, timeout=300)
        wait_for(lambda: _runtime_images(cluster, ns).get(f"{JOB}-worker-1", ("", ""))[0]
                 not in ("", pods[f"{JOB}-worker-1"][0]), timeout=120, describe="worker-1 replaced")
        mixed = _runtime_images(cluster, ns)
        assert mixed[f"{JOB}-worker-1"][1] == t.RUNTIME_IMAGE, mixed
        assert mixed[f"{JOB}-worker-0"] == pods[f"{JOB}-worker-0"], mixed
        return {"logs": capture.texts, "pods_before": pods, "upgrade_seconds": round(took, 1),
                "steps": (step, after_step, at_fault)}
    return scenario


@pytest.mark.uninstalls
def test_helm_upgrade_from_the_previous_release_keeps_a_running_job(
    env: Env, background: Background, reference: Any, tmp_path: Path
) -> None:
    background.drain()
    cluster = env.cluster
    t.remove_helm_install(cluster)
    rev, old_chart = previous_chart(tmp_path)
    newest = newest_field(old_chart)
    operator, runtime = previous_images(rev, Path(cluster.kubeconfig).resolve().parent, tmp_path)
    try:
        _helm(cluster, "install", t.RELEASE, str(old_chart), "-n", t.OPERATOR_NS, "--create-namespace",
              "--set", f"image.tag={operator.rsplit(':', 1)[1]}",
              "--set", f"runtimeImage.tag={runtime.rsplit(':', 1)[1]}")
        assert _operator_images(cluster) == {operator}
        assert not served(cluster, newest), f"{newest} served by the CRD of {rev[:12]}"
        t.log(f"the chart and images of {rev[:12]} installed")

        # The tier's trainer as the reference ran it (180 steps of ~0.6 s): the upgrade comes at its first checkpoint
        # (step 5) and takes seconds, the deletion after the next; most of the run is left after each.
        run = run_job(env, "upgrade", _upgrade_scenario(runtime, newest), claim=False)
        pods = run.extra["pods_before"]
        assert run.status.get("incidentCount") == 1, run.status.get("incidents")
        assert_same_model(run, reference)
        step, after_step, at_fault = run.extra["steps"]
        t.log(f"upgrade: Succeeded bitwise equal to the uninterrupted run; upgraded at global step {step}-{after_step}"
              f" ({run.extra['upgrade_seconds']}s), the same {len(pods)} worker pods trained on to step {at_fault}, "
              f"then worker-1 deleted and replaced by the new operator with the new runtime")
    finally:
        t.remove_helm_install(cluster)

"""Reading a job's checkpoint volume after the run: a helper pod (the worker image) on its PVC."""

from __future__ import annotations

import json
from typing import Any

from tests.conftest import Cluster, wait_for
from tests.e2e.training import WORKER_IMAGE, get_json

#: The final parameters' digest (bitwise comparisons) and the volume's top-level entries.
INSPECT_SCRIPT = r"""
import hashlib, json, os, torch
root = "/checkpoints"
params = torch.load(os.path.join(root, "final.pt"), map_location="cpu", weights_only=True)
h = hashlib.sha256()
for name in sorted(params):
    t = params[name].contiguous()
    h.update(name.encode()); h.update(str(t.dtype).encode()); h.update(str(tuple(t.shape)).encode())
    h.update(t.numpy().tobytes())
print(json.dumps({"sha256": h.hexdigest(), "tensors": len(params),
                  "entries": sorted(e for e in os.listdir(root) if not e.startswith("."))}))
"""


def inspect_volume(cluster: Cluster, ns: str, name: str, node_selector: dict[str, str],
                   script: str = INSPECT_SCRIPT) -> dict[str, Any]:
    """Run a helper pod (the worker image) on the job's checkpoint PVC; returns ``script``'s JSON (its last line
    of output)."""
    pod = f"{name}-inspect"
    manifest = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod, "namespace": ns},
        "spec": {"restartPolicy": "Never", "nodeSelector": node_selector, "terminationGracePeriodSeconds": 1,
                 "securityContext": {"fsGroup": 10001},
                 "containers": [{"name": "inspect", "image": WORKER_IMAGE, "imagePullPolicy": "IfNotPresent",
                                 "command": ["python", "-c", script],
                                 "volumeMounts": [{"name": "ckpt", "mountPath": "/checkpoints",
                                                   "readOnly": True}]}],
                 "volumes": [{"name": "ckpt", "persistentVolumeClaim": {"claimName": f"{name}-checkpoints"}}]},
    }
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
    wait_for(lambda: get_json(cluster, "pod", pod, "-n", ns)["status"].get("phase") in ("Succeeded", "Failed"),
             timeout=180, interval=1, describe=f"helper pod {pod} finished",
             state=lambda: cluster.kubectl("describe", "pod", pod, "-n", ns).stdout[-2500:])
    logs = cluster.kubectl("logs", "-n", ns, pod).stdout
    assert get_json(cluster, "pod", pod, "-n", ns)["status"]["phase"] == "Succeeded", logs
    result: dict[str, Any] = json.loads(logs.strip().splitlines()[-1])
    return result

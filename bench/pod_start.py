"""Benchmark (not a test): what the pods of a DDPJob cost to start on a real node, before and after the injected
runtime (issue 22). Two comparisons, each variant created in turn N times on the same node in one run:

- the rendezvous pod, create -> Ready: the operator's own pod spec (builders.build_rendezvous_pod: the pure-Python
  store in the runtime image) against the same pod as it was before, torch's TCPStore in the worker image
  (`python -m ddpjob_worker.rdzv --impl torch`);
- a worker pod, create -> its main container running: with the init container that `runtime.mode: Inject` adds
  (inject.init_container, the runtime's emptyDir) and without it (`runtime.mode: Image`). The main container
  only sleeps: what is measured is the pod start, not torch's import.

Times come from a watch on this side (the API's timestamps have a resolution of one second). The images must be
on the node already (`make e2e` imports them; or tests.e2e.training.import_images): an image pull is not part of
these numbers, and with a registry the image sizes it prints dominate instead.

    KUBECONFIG=... .venv/bin/python bench/pod_start.py [--runs 5] [--node-selector ddpjob.io/real-node=true]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "operator"), str(REPO / "worker")]

from ddpjob_operator.api.spec import parse_ddpjob  # noqa: E402
from ddpjob_operator.planner.children import builders, inject  # noqa: E402
from ddpjob_worker import contract  # noqa: E402

Obj = dict[str, Any]
Ready = Callable[[Obj], bool]


def job(runtime_image: str, worker_image: str, selector: dict[str, str]) -> Any:
    return parse_ddpjob({
        "apiVersion": "ddpjob.io/v1alpha1", "kind": "DDPJob",
        "metadata": {"name": "bench", "namespace": "default", "uid": str(uuid.uuid4())},
        "spec": {"replicas": 2, "runtime": {"image": runtime_image}, "rendezvous": {"nodeSelector": selector},
                 "template": {"spec": {
            "nodeSelector": selector,
            "containers": [{"name": "trainer", "image": worker_image, "command": ["python", "train.py"]}]}}},
    })


def rendezvous_pods(runtime_image: str, worker_image: str, selector: dict[str, str]) -> dict[str, Obj]:
    after = builders.build_rendezvous_pod(job(runtime_image, worker_image, selector))
    before = copy.deepcopy(after)
    container = before["spec"]["containers"][0]
    port = str(container["ports"][0]["containerPort"])
    container.update(image=worker_image, command=["python", "-m", "ddpjob_worker.rdzv", "--impl", "torch",
                                                  "--port", port])
    container["resources"]["limits"]["memory"] = "1Gi"  # torch's import needs ~0.7 GiB
    return {"rdzv: torch TCPStore, worker image (before)": before,
            "rdzv: pure-Python store, runtime image (after)": after}


def worker_pods(runtime_image: str, worker_image: str, selector: dict[str, str]) -> dict[str, Obj]:
    plain: Obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bench"}, "spec": {
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 0, "nodeSelector": selector,
        "automountServiceAccountToken": False,
        "containers": [{"name": "trainer", "image": worker_image, "imagePullPolicy": "IfNotPresent",
                        "command": ["sleep", "infinity"], "securityContext": dict(builders.RESTRICTED_CONTAINER)}],
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}}}}
    injected = copy.deepcopy(plain)
    spec = injected["spec"]
    spec["initContainers"] = [inject.init_container(runtime_image, builders.RESTRICTED_CONTAINER)]
    spec["volumes"] = [{"name": contract.RUNTIME_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}}]
    spec["containers"][0]["volumeMounts"] = [{"name": contract.RUNTIME_VOLUME, "mountPath": contract.RUNTIME_MOUNT_PATH,
                                              "readOnly": True}]
    return {"worker pod: runtime.mode Image (no init container)": plain,
            "worker pod: runtime.mode Inject (init container)": injected}


def is_ready(pod: Obj) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])


def is_running(pod: Obj) -> bool:
    return any((s.get("state") or {}).get("running") for s in pod["status"].get("containerStatuses") or [])


def start_once(api: client.CoreV1Api, namespace: str, pod: Obj, done: Ready, timeout: float = 180) -> float:
    """Create the pod, return seconds until ``done`` holds for it, delete it and wait until it is gone."""
    pod = copy.deepcopy(pod)
    name = f"bench-start-{uuid.uuid4().hex[:6]}"
    pod["metadata"] = {"name": name, "labels": {"app": "ddpjob-bench-pod-start"}}
    stream = watch.Watch()
    t0 = time.monotonic()
    api.create_namespaced_pod(namespace, pod)
    try:
        for event in stream.stream(api.list_namespaced_pod, namespace, field_selector=f"metadata.name={name}",
                                   timeout_seconds=int(timeout)):
            seen = api.api_client.sanitize_for_serialization(event["object"])
            if done(seen):
                return time.monotonic() - t0
            waiting = [(s.get("state") or {}).get("waiting") for s in seen["status"].get("containerStatuses") or []]
            if any(w and w.get("reason") not in (None, "ContainerCreating", "PodInitializing") for w in waiting):
                raise RuntimeError(f"{name}: {waiting}")
        raise TimeoutError(f"{name} not there after {timeout:.0f}s")
    finally:
        stream.stop()
        api.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        while api.list_namespaced_pod(namespace, field_selector=f"metadata.name={name}").items:
            time.sleep(0.2)


def measure(api: client.CoreV1Api, namespace: str, pods: dict[str, Obj], done: Ready, runs: int) -> None:
    times: dict[str, list[float]] = {label: [] for label in pods}
    start_once(api, namespace, next(iter(pods.values())), done)  # warm-up: the first start on a node is slower
    for _ in range(runs):
        for label, pod in pods.items():  # in turn, so that load on the machine hits every variant alike
            times[label].append(start_once(api, namespace, pod, done))
    first = statistics.median(next(iter(times.values())))
    for label, seconds in times.items():
        median = statistics.median(seconds)
        print(f"  {label:55s} median {median:6.2f}s  ({first / median:4.1f}x of the first)  "
              f"runs: {' '.join(f'{s:.2f}' for s in seconds)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--runtime-image", default="ddpjob-runtime:dev")
    parser.add_argument("--worker-image", default="ddpjob-worker:dev")
    parser.add_argument("--node-selector", default="ddpjob.io/real-node=true", help="key=value, or '' for none")
    args = parser.parse_args()
    selector = dict([args.node_selector.split("=", 1)]) if args.node_selector else {}
    config.load_kube_config()
    api = client.CoreV1Api()
    print(f"pod starts on a node with both images present; {args.runs} runs each, medians:")
    measure(api, args.namespace, rendezvous_pods(args.runtime_image, args.worker_image, selector), is_ready,
            args.runs)
    measure(api, args.namespace, worker_pods(args.runtime_image, args.worker_image, selector), is_running,
            args.runs)


if __name__ == "__main__":
    main()

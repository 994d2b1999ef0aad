"""Pure builders: a parsed DDPJob in, the Kubernetes objects of its children (plain dicts) out.

Nothing here talks to the API server, so every child can be checked by unit and golden tests. Owner
references are added at creation time (kube/client.py, with kopf.adopt), not here.
"""

from __future__ import annotations

import copy
from typing import Any

from ddpjob_worker import restart_request
from ddpjob_worker.contract import (
    DEFAULT_TERMINATION_LOG,
    POD_UID_ENV,
    RUNTIME_IMAGE_DIR,
    WORKER_GID,
    WORKER_UID,
    WorkerEnv,
)

from ddpjob_operator.api import names
from ddpjob_operator.api.spec import (
    API_VERSION,
    CHECKPOINT_VOLUME,
    GROUP,
    PLURAL,
    WORKER_CONTAINER,
    DDPJob,
    worker_container_index,
)
from ddpjob_operator.planner.children import gang, inject, storage

Obj = dict[str, Any]

#: Grace period given to a worker pod when the template sets none: the checkpoint library's SIGTERM path
#: needs time to write one last checkpoint.
DEFAULT_GRACE_SECONDS = 90
#: Part of the grace period reserved for torchrun and the kubelet after the final checkpoint.
GRACE_RESERVE_SECONDS = 30
#: The rendezvous pod's container meets the `restricted` Pod Security Standard, so a job runs in a namespace
#: that enforces it whenever its own template does.
RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "runAsUser": WORKER_UID,
    "runAsGroup": WORKER_GID,
    "seccompProfile": {"type": "RuntimeDefault"},
}

#: The restart request of an in-place stall restart (ddpjob_worker.restart_request), projected from the pod's
#: annotation: the kubelet rewrites the file when the operator changes the annotation, with no API access.
RESTART_REQUEST_VOLUME: Obj = {"name": restart_request.RESTART_VOLUME, "downwardAPI": {"items": [{
    "path": restart_request.REQUEST_FILE_NAME,
    "fieldRef": {"fieldPath": f"metadata.annotations['{restart_request.RESTART_ANNOTATION}']"}}]}}


def rdzv_endpoint(job: DDPJob) -> str:
    """host:port of the rendezvous store, resolvable through the headless Service."""
    host = f"{names.rendezvous_pod_name(job.name)}.{names.service_name(job.name)}.{job.namespace}.svc"
    return f"{host}:{job.spec.rendezvous.port}"


def rdzv_conf(job: DDPJob) -> str:
    """torchrun --rdzv-conf: the store lives in the rendezvous pod (is_host=false), plus the timeouts."""
    r = job.spec.rendezvous
    return (
        f"is_host=false,join_timeout={r.join_timeout_seconds},"
        f"last_call_timeout={r.last_call_seconds},close_timeout={r.close_timeout_seconds}"
    )


def claim_name(job: DDPJob) -> str | None:
    """The PVC the workers mount, or None when checkpoints live in a per-pod emptyDir."""
    ckpt = job.spec.checkpoint
    if ckpt.existing_claim:
        return ckpt.existing_claim
    if ckpt.volume_claim is not None:
        return names.pvc_name(job.name)
    return None


def _child(api_version: str, kind: str, name: str, job: DDPJob, labels: Obj | None = None, **body: Any) -> Obj:
    """A namespaced child object of ``job`` with the standard metadata; ``body`` holds its top-level fields."""
    metadata = {"name": name, "namespace": job.namespace, "labels": names.job_labels(job.name) if labels is None
                else labels}
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata, **body}


def _default_fs_group(pod_spec: Obj) -> None:
    # Most provisioners (hostPath, local PVs, many CSI drivers) create the volume root owned by root and not
    # world-writable, while the worker image runs as UID 10001: without an fsGroup the first checkpoint save
    # fails with EACCES. OnRootMismatch skips the recursive chown once the root already matches, so a volume
    # full of checkpoints does not slow every pod start. A user's own fsGroup is left alone.
    security: Obj = pod_spec.setdefault("securityContext", {})
    if "fsGroup" not in security:
        security["fsGroup"] = WORKER_GID
        security.setdefault("fsGroupChangePolicy", "OnRootMismatch")


def _contract_env(job: DDPJob, index: int, worker: Obj, grace: int) -> dict[str, str]:
    """The env contract of worker ``index`` (contract.py is its only definition)."""
    return WorkerEnv(
        job_name=job.name,
        namespace=job.namespace,
        job_uid=job.uid,
        worker_index=index,
        min_nodes=job.spec.min_replicas,
        max_nodes=job.spec.max_replicas,
        nproc_per_node=job.spec.nproc_per_node,
        rdzv_endpoint=rdzv_endpoint(job),
        max_restarts=job.spec.max_restarts,
        checkpoint_dir=job.spec.checkpoint.mount_path,
        checkpoint_keep=job.spec.checkpoint.keep,
        peer_timeout_seconds=job.spec.rendezvous.peer_timeout_seconds,
        rdzv_conf=rdzv_conf(job),
        sigterm_budget_seconds=max(1, grace - GRACE_RESERVE_SECONDS),
        report_progress=True,
        termination_log=str(worker.get("terminationMessagePath") or DEFAULT_TERMINATION_LOG),
    ).to_env()


def _wire_worker(job: DDPJob, index: int, worker: Obj, grace: int) -> None:
    """The worker container's env contract, termination message and mounts (checkpoint, restart request, store)."""
    env = _contract_env(job, index, worker, grace)
    worker.setdefault("name", WORKER_CONTAINER)
    # No clash with the user's variables: spec.py refuses a template that sets one the contract sets.
    worker["env"] = [*(worker.get("env") or []), *({"name": k, "value": v} for k, v in env.items()),
                     {"name": restart_request.DDPJOB_RESTART_REQUEST_FILE, "value": restart_request.REQUEST_FILE},
                     copy.deepcopy(POD_UID_ENV), *storage.storage_env(job)]
    _, store_mounts = storage.storage_volumes(job)
    # The planner copies this message into the Failed condition; logs are the fallback when the program
    # wrote no /dev/termination-log.
    worker.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
    mounts = [m for m in worker.get("volumeMounts") or [] if m.get("name") != CHECKPOINT_VOLUME]
    worker["volumeMounts"] = [
        *mounts,
        {"name": CHECKPOINT_VOLUME, "mountPath": job.spec.checkpoint.mount_path},
        {"name": restart_request.RESTART_VOLUME, "mountPath": restart_request.RESTART_MOUNT_PATH, "readOnly": True},
        *store_mounts,
    ]


def build_worker_pod(job: DDPJob, index: int, generation: int = 0, incidents: int = 0) -> Obj:
    """Worker pod ``<job>-worker-<index>`` from the template, with env contract, volume and DNS identity."""
    template = copy.deepcopy(job.spec.template)
    meta: Obj = template.get("metadata") or {}
    pod_spec: Obj = template.get("spec") or {}
    name = names.worker_pod_name(job.name, index)
    labels = {
        **(meta.get("labels") or {}),
        **names.job_labels(job.name),
        names.LABEL_REPLICA_TYPE: names.TYPE_WORKER,
        names.LABEL_REPLICA_INDEX: str(index),
        names.LABEL_RESTART_GENERATION: str(generation),
        names.LABEL_INCIDENT_GENERATION: str(incidents),
    }
    grace = int(pod_spec.get("terminationGracePeriodSeconds") or DEFAULT_GRACE_SECONDS)
    containers: list[Obj] = pod_spec.get("containers") or []
    wi = worker_container_index(containers)
    worker = containers[wi]
    _wire_worker(job, index, worker, grace)
    claim = claim_name(job)
    volume: Obj = (
        {"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": claim}}
        if claim
        else {"name": CHECKPOINT_VOLUME, "emptyDir": {}}
    )
    volumes = pod_spec.get("volumes") or []  # spec.py refuses a template volume named like ours
    store_volumes, _ = storage.storage_volumes(job)
    pod_spec.update(
        containers=containers,
        volumes=[*volumes, volume, RESTART_REQUEST_VOLUME, *store_volumes],
        hostname=name,
        subdomain=names.service_name(job.name),
        # The operator, not the kubelet, replaces failed workers: it must see each exit code to apply the
        # run policy and count restarts across the whole job.
        restartPolicy="Never",
        terminationGracePeriodSeconds=grace,
    )
    pod_spec.setdefault("serviceAccountName", names.WORKER_SERVICE_ACCOUNT)
    if job.spec.runtime.mode == "Inject":
        inject.inject_runtime(job, pod_spec, worker, RESTRICTED_CONTAINER)
    if claim:
        _default_fs_group(pod_spec)
    return gang.join(job, {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": job.namespace,
            "labels": labels,
            "annotations": dict(meta.get("annotations") or {}),
        },
        "spec": pod_spec,
    })


def build_rendezvous_pod(job: DDPJob) -> Obj:
    """Pod ``<job>-rdzv`` serving the c10d store from the small runtime image (a pure-Python store: no torch, no
    multi-GB pull), placed by spec.rendezvous (never by the workers' nodeSelector or tolerations)."""
    tmpl_spec: Obj = job.spec.template.get("spec") or {}
    name = names.rendezvous_pod_name(job.name)
    rdzv = job.spec.rendezvous
    port = rdzv.port
    container: Obj = {
        "name": "rendezvous",
        "image": inject.runtime_image(job),
        "imagePullPolicy": "IfNotPresent",
        "command": ["python3", f"{RUNTIME_IMAGE_DIR}/bin/ddpjob-rdzv", "--port", str(port)],
        "ports": [{"name": "rdzv", "containerPort": port, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 5},
        "resources": rdzv.pod_resources,
        "securityContext": copy.deepcopy(RESTRICTED_CONTAINER),
    }
    spec: Obj = {
        "containers": [container],
        "hostname": name,
        "subdomain": names.service_name(job.name),
        # A crashed store restarts in place (same IP and DNS name); the operator recreates a lost pod.
        "restartPolicy": "Always",
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 5,
    }
    # Pulling the runtime image needs the workers' credentials, and the pod sandbox their securityContext; where
    # it runs is its own (spec.rendezvous): the workers' nodeSelector and tolerations would put a CPU-only store on
    # a GPU node. Its priority is the job's, so that a preemption does not single it out.
    for key in ("imagePullSecrets", "securityContext", "priorityClassName"):
        if key in tmpl_spec:
            spec[key] = copy.deepcopy(tmpl_spec[key])
    placement = {"nodeSelector": rdzv.node_selector, "tolerations": rdzv.tolerations, "affinity": rdzv.affinity,
                 "priorityClassName": rdzv.priority_class_name}
    spec.update({key: copy.deepcopy(list(v) if isinstance(v, tuple) else v) for key, v in placement.items()
                 if v is not None})
    security: Obj = spec.setdefault("securityContext", {})
    security.setdefault("seccompProfile", {"type": "RuntimeDefault"})
    labels = {**names.job_labels(job.name), names.LABEL_REPLICA_TYPE: names.TYPE_RENDEZVOUS}
    return gang.join(job, _child("v1", "Pod", name, job, labels, spec=spec))


def build_service(job: DDPJob) -> Obj:
    """Headless Service giving every pod a stable DNS name, published before the pods are Ready."""
    port = job.spec.rendezvous.port
    return _child("v1", "Service", names.service_name(job.name), job, spec={
        "clusterIP": "None",
        # Workers resolve each other and the store while still starting (pytorch#73682): no nslookup
        # init-container hacks needed.
        "publishNotReadyAddresses": True,
        "selector": {names.LABEL_JOB_NAME: job.name},
        "ports": [{"name": "rdzv", "port": port, "targetPort": port}],
    })


def build_pvc(job: DDPJob) -> Obj | None:
    """Checkpoint PVC ``<job>-checkpoints``, or None when the job uses an existing claim or none."""
    vc = job.spec.checkpoint.volume_claim
    if vc is None or job.spec.checkpoint.existing_claim:
        return None
    spec: Obj = {"accessModes": list(vc.access_modes), "resources": {"requests": {"storage": vc.size}}}
    if vc.storage_class_name:
        spec["storageClassName"] = vc.storage_class_name
    return _child("v1", "PersistentVolumeClaim", names.pvc_name(job.name), job, spec=spec)


def build_worker_identity(namespace: str) -> list[Obj]:
    """The workers' ServiceAccount, a Role allowing only ``patch`` of DDPJob status in this namespace (rank 0
    reports progress), and the RoleBinding between them: one set per namespace, without an owner (they outlive
    any one job). Not per job: anyone who may create pods in a namespace may run them under any of its
    ServiceAccounts, so a per-job Role never separated two jobs of one namespace from each other; the namespace
    is the boundary either way (docs/api.md)."""
    name = names.WORKER_SERVICE_ACCOUNT
    labels = {"app.kubernetes.io/name": "ddpjob", names.IDENTITY_LABEL[0]: names.IDENTITY_LABEL[1],
              "app.kubernetes.io/managed-by": "ddpjob-operator"}

    def meta() -> Obj:
        return {"name": name, "namespace": namespace, "labels": dict(labels)}

    rbac = "rbac.authorization.k8s.io/v1"
    rule = {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "verbs": ["patch"]}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta()},
        {"apiVersion": rbac, "kind": "Role", "metadata": meta(), "rules": [rule]},
        {"apiVersion": rbac, "kind": "RoleBinding", "metadata": meta(),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]},
    ]


def build_network_policy(job: DDPJob) -> Obj:
    """Only the job's own pods may reach any of its pods (issue 23 #6): the rendezvous store accepts any client
    and every agent unpickles the rendezvous state it holds; rank 0's trainer serves the process group's store,
    and gloo and NCCL listen on every worker. Policies add up, so a port a user wants open (TensorBoard on rank 0)
    takes one more NetworkPolicy of theirs. Enforced where the cluster's network plugin implements NetworkPolicy
    (most do; the local real node's bridge plugin does not)."""
    own = {"podSelector": {"matchLabels": {names.LABEL_JOB_NAME: job.name}}}
    return _child("networking.k8s.io/v1", "NetworkPolicy", names.network_policy_name(job.name), job, spec={
        **own,
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [own]}],
    })


def build_static_children(job: DDPJob) -> list[Obj]:
    """Every non-pod child of the job, in dependency order; ensured on every pass (the namespace's worker identity
    is ensured apart, identity.py)."""
    objs = [build_service(job), *([build_network_policy(job)] if job.spec.network_policy_required else [])]
    pvc = build_pvc(job)
    if pvc is not None:
        objs.append(pvc)
    if job.spec.scheduling.gang is not None:  # built pods only then: a worker pod was 4 % of a burst's CPU (issue 46)
        # Before any pod: coscheduling denies a pod whose PodGroup it cannot find.
        objs.append(gang.build_pod_group(job, build_worker_pod(job, 0), build_rendezvous_pod(job)))
    return objs


def owner_reference(job_body: Obj) -> Obj:
    """A controller ownerReference to the DDPJob (what kopf.adopt would add), for pure tests and goldens."""
    meta = job_body["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": "DDPJob",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


#: Weight of the replacement's preference for any node but the one its group found silent (the maximum).
AVOID_WEIGHT = 100


def avoiding_node(pod: Obj, node: str) -> Obj:
    """``pod`` preferring any node but ``node``: the replacement of a pod its group found silent (its node may be
    powered off, yet Ready to Kubernetes for another 15-40 s, and with that pod force-deleted it looks free). A
    preference, not a rule: on a one-node cluster (a frozen pod, not a lost node) it still runs there."""
    out = copy.deepcopy(pod)
    affinity = out["spec"].setdefault("affinity", {}).setdefault("nodeAffinity", {})
    preferred = affinity.setdefault("preferredDuringSchedulingIgnoredDuringExecution", [])
    preferred.append({"weight": AVOID_WEIGHT, "preference": {
        "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": [node]}]}})
    return out

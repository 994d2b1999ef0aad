"""Names and labels of a DDPJob's children: one place, so builders, the planner and tests agree."""

from __future__ import annotations

from ddpjob_operator.api.spec import GROUP

LABEL_JOB_NAME = f"{GROUP}/job-name"
LABEL_REPLICA_TYPE = f"{GROUP}/replica-type"
LABEL_REPLICA_INDEX = f"{GROUP}/replica-index"
LABEL_RESTART_GENERATION = f"{GROUP}/restart-generation"
#: The job's incident count when the pod was created: a floor under status.incidentCount that a stale read of
#: the DDPJob cannot lower.
LABEL_INCIDENT_GENERATION = f"{GROUP}/incident-generation"

TYPE_WORKER = "worker"
TYPE_RENDEZVOUS = "rendezvous"

#: The field manager of the operator's writes (`kubectl get --show-managed-fields` names it).
FIELD_MANAGER = "ddpjob-operator"
#: The coordination Lease the operator's replicas elect their leader with (in the operator's namespace).
LEADER_LEASE = "ddpjob-operator"
#: The workers' ServiceAccount, and its Role and RoleBinding: one per namespace, shared by every job there
#: (rank 0 patches its job's status.progress with it). Per job, the three cost 3 of ~17 API requests per job.
WORKER_SERVICE_ACCOUNT = "ddpjob-worker"
#: The label the identity's objects carry; the operator watches them by it.
IDENTITY_LABEL = ("app.kubernetes.io/component", "worker-identity")


def service_name(job: str) -> str:
    """The headless Service; it is also the pods' subdomain."""
    return job


def worker_pod_name(job: str, index: int) -> str:
    """Deterministic worker pod name: creating it twice is a harmless 409, never a duplicate."""
    return f"{job}-worker-{index}"


def rendezvous_pod_name(job: str) -> str:
    """The pod that serves the c10d TCPStore."""
    return f"{job}-rdzv"


def pvc_name(job: str) -> str:
    """The checkpoint PVC the operator creates when spec.checkpoint.volumeClaim is set."""
    return f"{job}-checkpoints"


def network_policy_name(job: str) -> str:
    """NetworkPolicy that lets only the job's own pods reach its rendezvous port."""
    return f"{job}-rdzv"


def pod_group_name(job: str) -> str:
    """The PodGroup of a gang job (spec.scheduling.gang): one per job, named like it."""
    return job


def job_labels(job: str) -> dict[str, str]:
    """Labels every child carries; the Service and the scale subresource select on LABEL_JOB_NAME."""
    return {
        LABEL_JOB_NAME: job,
        "app.kubernetes.io/name": "ddpjob",
        "app.kubernetes.io/instance": job,
        "app.kubernetes.io/managed-by": "ddpjob-operator",
    }


def selector(job: str) -> str:
    """Label selector string of the job's worker pods (status.selector, for the scale subresource)."""
    return f"{LABEL_JOB_NAME}={job},{LABEL_REPLICA_TYPE}={TYPE_WORKER}"

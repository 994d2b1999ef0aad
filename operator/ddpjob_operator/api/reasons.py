"""Every reason the operator writes into a DDPJob condition's or Event's ``reason``, defined once (docs/api.md,
"Reasons"): the wire strings are API, users match on them, so a value never changes."""

# Reasons that pass through from elsewhere and have no constant here (not ours):
# - Restarting's reason (and Running's, False) is the recovering incident's cause (the causes below);
# - Queued (True) carries Kueue's reason of the Workload's QuotaReserved condition while Kueue holds the job
#   (planner/kueue/gate.py), Admitted (False) the Queued reason, and the Workload's Requeued the eviction's reason
#   (planner/kueue/admission.py);
# - PodsCannotStart (True) carries the kubelet's waiting reason (ErrImagePull, ImagePullBackOff, ...:
#   planner/policies/cannot_start.py BLOCKED_REASONS);
# - the Kubernetes reasons a lost pod is classified by (DisruptionTarget's, the kubelet's) only name its cause
#   (planner/policies/failure.py).

# The job's state conditions (Created, Running, Restarting, Suspended, Succeeded, Failed).

#: Created, True: the operator accepted the job and manages its pods (every job but an invalid one; no Event).
JOB_CREATED = "JobCreated"
#: Running, False (state Created): not every worker and the rendezvous pod run yet.
WORKERS_STARTING = "WorkersStarting"
#: Running, True: every worker and the rendezvous pod run.
ALL_WORKERS_RUNNING = "AllWorkersRunning"
#: Restarting, False: every worker runs again after an incident.
WORKERS_RECOVERED = "WorkersRecovered"
#: Suspended, True: spec.runPolicy.suspend is true and the pods are deleted; also the Suspended condition type.
SUSPENDED = "Suspended"
#: Suspended, False: the job was resumed.
RESUMED = "Resumed"
#: Succeeded, True: a worker exited 0 and every other one ended (or the rendezvous close timeout passed).
WORKERS_SUCCEEDED = "WorkersSucceeded"
#: Failed, True: a worker exited with a permanent exit code.
PERMANENT_EXIT_CODE = "PermanentExitCode"
#: Failed, True: more incidents than spec.runPolicy.backoffLimit.
BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
#: Failed, True: the job was active longer than spec.runPolicy.activeDeadlineSeconds.
DEADLINE_EXCEEDED = "DeadlineExceeded"
#: Failed, True: the job stalled with ``onStall: Fail``.
PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
#: Failed, True: the spec of a job that never started is invalid; SpecRejected, True: an edit of a running job is.
INVALID_SPEC = "InvalidSpec"
#: Failed, True: the API server rejected a pod built from the template (400/422).
INVALID_POD_TEMPLATE = "InvalidPodTemplate"
#: Failed, True: the API server rejected another child built from the spec (400/422).
CHILD_REJECTED = "ChildRejected"

# Incident causes: status.incidents[].cause, the Restarting condition's reason while the incident recovers, and
# the cause label of ddpjob_incidents_total.

#: A worker failed with a retryable exit code (or its command could not start); also the loss's Warning Event.
WORKER_FAILED = "WorkerFailed"
#: A worker was OOM-killed; also Kubernetes' reason of a container the kernel killed for memory, which it reads.
OOM_KILLED = "OOMKilled"
#: A pod was deleted by someone else (or went missing while no operator watched).
POD_DELETED = "PodDeleted"
#: A pod was evicted (the Eviction API, the scheduler's preemption, the kubelet).
POD_EVICTED = "PodEvicted"
#: A pod's node was lost (NotReady, gone, shut down) or its group reported it silent; also Kubernetes' reason of a
#: pod whose node became unreachable, which it reads.
NODE_LOST = "NodeLost"
#: The rendezvous pod ended or went missing; also its loss's Warning Event.
RENDEZVOUS_LOST = "RendezvousLost"
#: The group stalled and ``onStall: RestartGroup`` restarted it; also the Stalled condition type and the reason of
#: its Warning Event.
STALLED = "Stalled"

# The Stalled condition: True while a deadline passed, False saying which clock runs.

#: Stalled, True: a deadline passed while some pods do not run (reported, never restarted).
PODS_PENDING = "PodsPending"
#: Stalled, True: no step since the group started, past startupDeadlineSeconds.
NO_PROGRESS_SINCE_START = "NoProgressSinceStart"
#: Stalled, True: no step for progressDeadlineSeconds after the last one.
PROGRESS_STOPPED = "ProgressStopped"
#: Stalled, True: rank 0's script returned but the workers did not exit in time (reported, never restarted).
NOT_EXITING = "NotExiting"
#: Stalled, True: the group was restarted after a stall; waiting for its first step.
RESTARTED_AFTER_STALL = "RestartedAfterStall"
#: Stalled, False: training reports steps.
PROGRESSING = "Progressing"
#: Stalled, False: the group did no step yet, within its start-up allowance.
STARTING_UP = "StartingUp"
#: Stalled, False: the worker runtime cannot count the command's steps.
STEPS_NOT_VISIBLE = "StepsNotVisible"
#: Stalled, False: progressDeadlineSeconds is 0.
STALL_DETECTION_OFF = "StallDetectionOff"
#: Stalled, False: rank 0's script returned; waiting for the workers to exit.
FINISHING = "Finishing"
#: Stalled, False: the job runs no pods (suspended, queued).
NOT_RUNNING = "NotRunning"
#: Stalled, Queued, ChildConflict, CreateRefused and PodsCannotStart, False: the job finished (Succeeded or Failed),
#: so nothing holds or threatens it any more.
JOB_FINISHED = "JobFinished"

# The Queued condition, from the scheduler (a job not in a Kueue queue, or admitted).

#: Queued, True: no pod of the job is placed and the scheduler called them Unschedulable; also Kubernetes'
#: PodScheduled reason, which it reads.
UNSCHEDULABLE = "Unschedulable"
#: Queued, True: as Unschedulable, for a gang job (spec.scheduling.gang).
GANG_UNSCHEDULABLE = "GangUnschedulable"
#: Queued, False: the scheduler placed a pod of the job.
SCHEDULED = "Scheduled"
#: Queued, False: no pod waits for the scheduler.
NOT_QUEUED = "NotQueued"

# Queued and Admitted of a job in a Kueue queue (also the Queued state's reason while Kueue holds the job).

#: Queued, True: the job's WorkloadPriorityClass does not exist; CreateRefused, True: the PriorityClass a pod names
#: does not exist (the Priority admission plugin's 403).
PRIORITY_CLASS_NOT_FOUND = "PriorityClassNotFound"
#: Queued, True: the operator created the job's Workload; waiting for Kueue.
WORKLOAD_CREATED = "WorkloadCreated"
#: Queued, True: Kueue evicted the job (the eviction's reason is in the message); also Kueue's eviction reason of a
#: preemption, which it reads.
PREEMPTED = "Preempted"
#: Queued, True: the job's Workload is Finished; deleting it queues the job again.
WORKLOAD_FINISHED = "WorkloadFinished"
#: Queued, True: Kueue reserved quota; waiting for the admission checks.
ADMISSION_CHECKS_PENDING = "AdmissionChecksPending"
#: Queued, True: Kueue has not considered the Workload yet; also Kueue's QuotaReserved reason, written on the
#: Workload when an evicted job gives its quota back.
PENDING = "Pending"
#: Queued, False, and Admitted, True (the Admitted condition type too): Kueue admitted the job.
ADMITTED = "Admitted"
#: Kueue's eviction reason of a Workload whose nodes failed: with Preempted, the evictions that mark the given-back
#: Workload Requeued.
NODE_FAILURES = "NodeFailures"

# Kueue's words, which the operator writes on the job's Workload as Kueue's jobframework does (its Finished reason
# is the job's end, Succeeded or Failed; Requeued carries the eviction's reason; QuotaReserved's is Pending).

#: The Workload's PodsReady, False (Kueue's): admitted, not every pod of the job runs yet (waitForPodsReady times it).
WAIT_FOR_START = "WaitForStart"
#: The Workload's PodsReady, True (Kueue's): every pod of the admitted job ran.
STARTED = "Started"
#: The Workload's Admitted, False (Kueue's): the operator gave an evicted job's quota back.
NO_RESERVATION = "NoReservation"

# ChildConflict and CreateRefused: what the API server answered the last creates.

#: ChildConflict, True: an object with a child's name is not controlled by this job; also the condition type and
#: the reason of its Warning Event.
CHILD_CONFLICT = "ChildConflict"
#: ChildConflict, False: every child is controlled by this job.
NO_CONFLICT = "NoConflict"
#: CreateRefused, True: the namespace's Pod Security admission refused a pod.
POD_SECURITY = "PodSecurity"
#: CreateRefused, True: a ResourceQuota is exhausted.
QUOTA_EXCEEDED = "QuotaExceeded"
#: CreateRefused, True: a ResourceQuota counts a resource the pod does not set (limits.cpu, say).
QUOTA_NEEDS_RESOURCES = "QuotaNeedsResources"
#: CreateRefused, True: RBAC: the 403 names the operator's identity and a verb it may not use.
FORBIDDEN = "Forbidden"
#: CreateRefused, True: a LimitRange of the namespace refused the pod's requests or limits.
LIMIT_RANGE_VIOLATED = "LimitRangeViolated"
#: CreateRefused, True: the ServiceAccount a pod names does not exist (the ServiceAccount admission plugin).
SERVICE_ACCOUNT_MISSING = "ServiceAccountMissing"
#: CreateRefused, True: an admission webhook, a ValidatingAdmissionPolicy or another admission plugin refused it.
ADMISSION_DENIED = "AdmissionDenied"
#: CreateRefused, True: the job's NetworkPolicy could not be created: no pod is created until it is.
NETWORK_POLICY_REFUSED = "NetworkPolicyRefused"
#: CreateRefused, True: an optional child's API (Kueue's Workload, the gang's PodGroup) is not served.
CRD_NOT_INSTALLED = "CRDNotInstalled"
#: CreateRefused, False: the API server accepted every create; also the Created condition type.
CREATED = "Created"

# The other conditions' False reasons.

#: SpecRejected, False: the current spec is valid.
SPEC_ACCEPTED = "SpecAccepted"
#: PodsCannotStart, False: no pod of the job is blocked from starting (True carries the kubelet's reason).
STARTING = "Starting"

# StatusUnprotected: whether the chart's worker admission policy holds each worker to its own job's status.progress
# (the operator checks the policy and its binding at start and every resync).

#: StatusUnprotected, True: the worker admission policy or its binding does not exist (or its API is not served).
ADMISSION_POLICY_MISSING = "AdmissionPolicyMissing"
#: StatusUnprotected, True: the operator could not read the policy or its binding (RBAC, an API error).
ADMISSION_POLICY_UNVERIFIED = "AdmissionPolicyUnverified"
#: StatusUnprotected, False: the policy and its binding exist and deny.
ADMISSION_POLICY_IN_FORCE = "AdmissionPolicyInForce"

# Events: besides the transitions of the state conditions (named by their reason), the losses (WorkerFailed,
# RendezvousLost) and the auxiliary conditions' (named by their type: Stalled, ChildConflict and these).

#: Event, Normal: a lost worker was replaced.
WORKER_REPLACED = "WorkerReplaced"
#: Event, Normal: an incident recovered (training stepped again after it).
INCIDENT_RECOVERED = "IncidentRecovered"
#: Event, Warning: a child that existed was missing and was created again.
CHILD_RECREATED = "ChildRecreated"
#: Event, Warning: the agents did not re-form the group after an in-place restart request; the pods are replaced.
RESTART_IN_PLACE_UNANSWERED = "RestartInPlaceUnanswered"
#: Event, Warning: a time in status.progress cannot be read; it is ignored (said once per job).
PROGRESS_UNREADABLE = "ProgressUnreadable"
#: Event, Warning: the CreateRefused condition became True (also its type).
CREATE_REFUSED = "CreateRefused"
#: Event, Normal: the Queued condition became True (also its type, and the job's state).
QUEUED = "Queued"
#: Event, Warning: the PodsCannotStart condition became True (also its type).
PODS_CANNOT_START = "PodsCannotStart"
#: Event, Normal: the SpecRejected condition became True (also its type).
SPEC_REJECTED = "SpecRejected"
#: Event, Warning: the StatusUnprotected condition became True (also its type).
STATUS_UNPROTECTED = "StatusUnprotected"

# Kubernetes' reasons the operator compares against (never written by it).

#: Kubernetes': the reason of a pod the kubelet evicted (node pressure): the loss is PodEvicted.
EVICTED = "Evicted"
#: Kubernetes': the waiting reason of a container whose init containers run: the init container's reason says why.
POD_INITIALIZING = "PodInitializing"

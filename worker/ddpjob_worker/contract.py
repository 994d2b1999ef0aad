"""The environment contract between the operator (which writes it into every worker pod) and the worker
(which reads it): defined once here and imported by both, so the two sides cannot drift.

torchrun reads every ``PET_<ARG>`` variable as its ``--<arg>`` option, so a plain ``torchrun train.py`` in a
worker pod already gets the job's rendezvous settings; ``ddp-worker`` reads the same variables to validate
them and to add what torchrun does not know (checkpoint directory, job identity, progress reporting).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping, Sequence

# --- torchrun's own variables (torch.distributed.run reads PET_* as defaults for its options) ---

#: torchrun ``--nnodes``: ``"N"`` for a fixed job, ``"MIN:MAX"`` for an elastic one.
PET_NNODES = "PET_NNODES"
#: torchrun ``--nproc-per-node``: ``auto``, ``gpu``, ``cpu`` or a positive integer.
PET_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
#: torchrun ``--rdzv-backend``; always ``c10d``.
PET_RDZV_BACKEND = "PET_RDZV_BACKEND"
#: torchrun ``--rdzv-endpoint``: ``host:port`` of the job's rendezvous store.
PET_RDZV_ENDPOINT = "PET_RDZV_ENDPOINT"
#: torchrun ``--rdzv-id``: the DDPJob's UID, unique per job (a reused job name never joins an old run,
#: pytorch#82160) and stable across pod restarts.
PET_RDZV_ID = "PET_RDZV_ID"
#: torchrun ``--rdzv-conf``: ``is_host=false`` (the store lives in the rendezvous pod, not in any agent, so
#: losing any worker pod never takes the store down, pytorch#67742) plus timeouts.
PET_RDZV_CONF = "PET_RDZV_CONF"
#: torchrun ``--max-restarts``: in-pod restarts of the worker group before the agent gives up.
PET_MAX_RESTARTS = "PET_MAX_RESTARTS"

#: ``"1"``: each rendezvous round publishes a fresh MASTER_ADDR/MASTER_PORT. With torch's default (sharing the
#: rank-0 agent's TCP store with the workers) the rank-0 agent publishes them only in its first round, so an
#: agent that joins later (a replacement pod) waits forever for MASTER_ADDR and the job hangs (seen with torch
#: 2.15: SIGKILL an agent, start a replacement, both agents time out in round 1).
TORCH_DISABLE_SHARE_RDZV_TCP_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"

# --- ddpjob's own variables ---

#: Name of the DDPJob.
DDPJOB_NAME = "DDPJOB_NAME"
#: Namespace of the DDPJob.
DDPJOB_NAMESPACE = "DDPJOB_NAMESPACE"
#: UID of the DDPJob (same value as PET_RDZV_ID; kept separately so scripts need not parse torchrun's env).
DDPJOB_UID = "DDPJOB_UID"
#: Index of this worker pod, 0..replicas-1 (not the torch rank: ranks are assigned at each rendezvous).
DDPJOB_WORKER_INDEX = "DDPJOB_WORKER_INDEX"
#: Directory on the shared checkpoint volume where the checkpoint library keeps ``step-N`` folders.
DDPJOB_CHECKPOINT_DIR = "DDPJOB_CHECKPOINT_DIR"
#: Seconds a worker may spend writing its last checkpoint after SIGTERM (kept below the pod's grace period).
DDPJOB_SIGTERM_BUDGET_SECONDS = "DDPJOB_SIGTERM_BUDGET_SECONDS"
#: ``"1"`` when rank 0 should report progress into the DDPJob's status (in a cluster), else ``"0"``.
DDPJOB_REPORT_PROGRESS = "DDPJOB_REPORT_PROGRESS"
#: The DDPJob status field where the operator sets the least seconds between two routine progress reports of rank 0
#: (its write budget for all running jobs; absent: the reporter's own interval). Rank 0 reads it from the answer to
#: each report (ddpjob_worker.progress).
STATUS_REPORT_INTERVAL = "reportIntervalSeconds"
#: Optional: a file where rank 0 also writes its progress as JSON (``ddpjob run`` reads it for its live view;
#: unset in pods).
DDPJOB_PROGRESS_FILE = "DDPJOB_PROGRESS_FILE"
#: Set by the agent for the trainers it starts: Unix time (ms) at which their group's rendezvous completed.
DDPJOB_RENDEZVOUS_TIME = "DDPJOB_RENDEZVOUS_TIME"
#: This pod's UID, from the downward API (``metadata.uid``; POD_UID_ENV): the agent's rendezvous node carries it, so
#: a report of a silent peer names that very pod, not a later pod of the same name (ddpjob_worker.peerreport).
DDPJOB_POD_UID = "DDPJOB_POD_UID"
POD_UID_ENV = {"name": DDPJOB_POD_UID, "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}
#: Optional: how many checkpoints the library keeps (``spec.checkpoint.keep``); default 3.
DDPJOB_CHECKPOINT_KEEP = "DDPJOB_CHECKPOINT_KEEP"
#: Optional (a user knob): seconds ``ddp-worker`` waits for the rendezvous host to resolve in DNS before it exits
#: with EXIT_DNS_UNRESOLVED (pytorch#73682: a headless Service's records appear some seconds after the pod starts).
DDPJOB_DNS_WAIT_SECONDS = "DDPJOB_DNS_WAIT_SECONDS"
#: File where ``ddp-worker`` writes the one-line root cause of a failure (the container's
#: ``terminationMessagePath``, ``/dev/termination-log`` by default), so the operator's Events and conditions
#: say what went wrong instead of a log tail.
DDPJOB_TERMINATION_LOG = "DDPJOB_TERMINATION_LOG"
#: Optional (a user knob): ``"0"`` turns pre-started trainers off. By default the agent keeps one trainer process
#: per local rank started ahead of time (python up, torch imported, waiting for its rank), so a restart or a hot
#: spare's takeover does not pay the interpreter start and ``import torch`` again; costs one idle process per
#: local rank (its memory is in docs/recovery.md).
DDPJOB_WARM_TRAINERS = "DDPJOB_WARM_TRAINERS"
#: Optional: seconds a peer agent may stay silent before the others take it for lost, remove it from the
#: rendezvous round and re-form the group (``spec.rendezvous.peerTimeoutSeconds``; ddpjob_worker.peerwatch);
#: ``0`` turns the watch off (torch's own 15 s heartbeat expiry and the collectives' timeouts remain).
DDPJOB_PEER_TIMEOUT_SECONDS = "DDPJOB_PEER_TIMEOUT_SECONDS"
#: Set by the agent in a pre-started trainer's environment only: it waits for its rank before running the script.
DDPJOB_STANDBY = "DDPJOB_STANDBY"
#: Optional: ``1`` when the checkpoint folder is the pod's own (no claim): the agent copies what the script writes
#: there to the job's other pods and syncs them before each group starts (ddpjob_worker.replication).
DDPJOB_REPLICATION = "DDPJOB_REPLICATION"
#: Optional: the port of every pod's replication server (default DEFAULT_REPLICA_PORT).
DDPJOB_REPLICA_PORT = "DDPJOB_REPLICA_PORT"
#: Optional: the DNS name whose records are the job's pods (its headless Service): the replicas' peers.
DDPJOB_REPLICA_SERVICE = "DDPJOB_REPLICA_SERVICE"
#: Optional (tests, several agents on one machine): the peers' ``host:port``, comma-separated, instead of DNS.
DDPJOB_REPLICA_PEERS = "DDPJOB_REPLICA_PEERS"
#: Optional: this pod's replication address as its peers reach it (default: its hostname, resolved).
DDPJOB_REPLICA_ADDRESS = "DDPJOB_REPLICA_ADDRESS"
#: Optional: bytes of other pods' checkpoints one pod keeps at most (spec.checkpoint.replication.maxBytes; 0: none).
DDPJOB_REPLICA_BUDGET_BYTES = "DDPJOB_REPLICA_BUDGET_BYTES"
#: Optional: seconds a group waits at most for its pods to agree on their checkpoints before it starts.
DDPJOB_REPLICA_SYNC_SECONDS = "DDPJOB_REPLICA_SYNC_SECONDS"
#: The process name (``/proc/PID/comm``) of a pre-started trainer once its imports are done and it waits for its
#: rank; it takes the interpreter's name back when it gets one.
STANDBY_PROCESS_NAME = "ddpjob-standby"
#: The module ddp-worker runs every Python training script under (``python -m ddpjob_worker.recorded``): it leaves
#: the error file, and it is what a pre-started trainer runs (the launcher recognizes its own command by it).
RECORDED_MODULE = "ddpjob_worker.recorded"

DEFAULT_RDZV_PORT, DEFAULT_REPLICA_PORT = 29400, 29401
DEFAULT_REPLICA_SYNC_SECONDS = 300
DEFAULT_SIGTERM_BUDGET_SECONDS = 60
DEFAULT_CHECKPOINT_KEEP = 3
DEFAULT_DNS_WAIT_SECONDS = 300
DEFAULT_PEER_TIMEOUT_SECONDS = 5
DEFAULT_TERMINATION_LOG = "/dev/termination-log"

#: Exit code of ``ddp-worker`` when the contract is broken (EX_CONFIG from sysexits.h). The operator's
#: default policy treats it as permanent: restarting a pod with a broken environment cannot help.
EXIT_BAD_CONTRACT = 78

#: Exit code of the injected runtime when the worker image cannot run it (no torch, or a torch or Python older than
#: the supported range). Permanent under the default policy: every replacement pod would use the same image.
EXIT_BAD_IMAGE = 79

#: The injected runtime (docs/worker.md): the operator's init container copies RUNTIME_IMAGE_DIR of the runtime
#: image into the emptyDir RUNTIME_VOLUME, mounted read-only at RUNTIME_MOUNT_PATH in the worker container, whose
#: command becomes ``<python> RUNTIME_MOUNT_PATH/bin/ddp-worker -- <training command>``.
RUNTIME_IMAGE_DIR = "/opt/ddpjob-runtime"
RUNTIME_VOLUME = "ddpjob-runtime"
RUNTIME_MOUNT_PATH = "/ddpjob"
RUNTIME_INIT_CONTAINER = "ddpjob-runtime"
#: The worker container's image, set by the operator so that the runtime's messages can name it.
DDPJOB_IMAGE = "DDPJOB_IMAGE"
#: torch releases the runtime is tested on (``make test-compat``): older ones are refused with EXIT_BAD_IMAGE,
#: newer ones run with a warning. Python: 3.10 is the oldest the runtime's code can run on (3.11 is tested).
TORCH_MIN_VERSION = (2, 6)
TORCH_MAX_TESTED_VERSION = (2, 15)
PYTHON_MIN_VERSION = (3, 10)

#: Container exit codes of ``ddp-worker`` beyond the trainer's own. All are >= 128, so the operator's default policy
#: retries them: each says the pod lost something outside the program, never that the program is broken.
#: The agent lost the rendezvous store, or its rendezvous timed out or was closed (the store pod was deleted,
#: restarted or is unreachable); a replacement pod joins the new store.
EXIT_RENDEZVOUS_LOST = 200
#: The training group failed because a peer was lost (a collective failed with a connection error or timeout):
#: the cause is another pod, not this one.
EXIT_PEER_LOST = 201
#: The rendezvous host did not resolve within DDPJOB_DNS_WAIT_SECONDS (is the job's headless Service there?).
EXIT_DNS_UNRESOLVED = 202
#: The group could not agree on its checkpoints within DDPJOB_REPLICA_SYNC_SECONDS: a pod lacked a file of the
#: newest complete checkpoint and no pod that holds it answered (ddpjob_worker.replication.groupsync).
EXIT_CHECKPOINT_SYNC = 203

#: UID and GID the worker image runs as (Dockerfile: ``USER 10001:10001``); worker pods get this ``fsGroup``.
WORKER_UID, WORKER_GID = 10001, 10001

#: ddpjob variables a template may set: tuning knobs, not identity or wiring.
USER_SETTABLE_ENV = frozenset({DDPJOB_DNS_WAIT_SECONDS, DDPJOB_WARM_TRAINERS})
#: The values DDPJOB_WARM_TRAINERS takes (any case): the first four turn pre-started trainers off.
WARM_TRAINERS_OFF = frozenset({"0", "false", "no", "off"})
WARM_TRAINERS_ON = frozenset({"1", "true", "yes", "on"})


def knob_error(name: str, value: str) -> str | None:
    """What is wrong with a user knob's value (``<NAME>=<value>: ...``), or None: the operator refuses a template
    with a bad one before any pod exists, and ``ddp-worker`` names the variable if one arrives anyway (envFrom)."""
    if name == DDPJOB_DNS_WAIT_SECONDS:
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not 0 <= seconds < float("inf"):
            return f"{name}={value!r} must be a number of seconds >= 0 (default {DEFAULT_DNS_WAIT_SECONDS})"
    elif name == DDPJOB_WARM_TRAINERS and value.strip().lower() not in WARM_TRAINERS_OFF | WARM_TRAINERS_ON:
        return f"{name}={value!r} must be 0 or 1 (or false/true, no/yes, off/on)"
    return None


#: What torchrun sets in every training process: a template value would be overwritten or, worse, read by a
#: script before torchrun's (MASTER_ADDR from a template points every rank at the wrong host).
TORCHRUN_ENV = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
    "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", TORCH_DISABLE_SHARE_RDZV_TCP_STORE,
})
#: Prefixes owned by torchrun (PET_* are its options, TORCHELASTIC_* its run state) and by this contract.
RESERVED_ENV_PREFIXES = ("PET_", "TORCHELASTIC_", "DDPJOB_")


def reserved_env(name: str) -> bool:
    """True for a variable the contract or torchrun sets in every worker: a pod template may not set it (the
    operator refuses such a DDPJob before any pod exists, naming the variable)."""
    if name in USER_SETTABLE_ENV:
        return False
    return name in TORCHRUN_ENV or name.startswith(RESERVED_ENV_PREFIXES)


#: Interpreter flags the recorded runner may drop from ``python FLAGS script``: ``-u`` is what ddp-worker's
#: PYTHONUNBUFFERED=1 does anyway. Any other flag changes how Python runs, so such a command runs as it is.
DROPPABLE_PYTHON_FLAGS = frozenset({"-u"})
#: The image's entrypoint, which runs the training command under torchrun and the recorded runner.
WORKER_ENTRYPOINT = "ddp-worker"


def runs_python(command: Sequence[str]) -> bool:
    """Whether ``command`` starts with a Python interpreter (``python``, ``python3``, ``/opt/conda/bin/python``)."""
    return bool(command) and os.path.basename(command[0]).startswith("python")


def python_target(command: Sequence[str]) -> tuple[bool, list[str]] | None:
    """``(as_module, [target, *args])`` when ``command`` runs Python code that the recorded runner can run in the
    trainer process itself (``python x.py ...``, ``python -u x.py``, ``python -m pkg ...``, ``x.py ...``); None for
    anything else (a binary, a shell script, ``python -c``), which torchrun runs with ``--no-python``. ddp-worker
    builds the trainer's command with it and the operator asks it whether the runtime can see a job's steps."""
    if not command:
        return None
    if runs_python(command):
        rest = list(command[1:])
        while rest and rest[0] in DROPPABLE_PYTHON_FLAGS:
            rest = rest[1:]
        if len(rest) >= 2 and rest[0] == "-m":
            return True, rest[1:]
        if rest and not rest[0].startswith("-"):
            return False, rest
        return None
    return (False, list(command)) if command[0].endswith(".py") else None


def training_command(command: Sequence[str] | None, args: Sequence[str] | None) -> list[str] | None:
    """The command ddp-worker runs for a container with this ``command`` and ``args``: its args under the image's
    entrypoint (no ``command``, or ``command: [ddp-worker, ...]``); None when the container replaces ddp-worker with
    a program of its own, which then runs without the worker runtime."""
    command, args = [str(c) for c in command or []], [str(a) for a in args or []]
    if command and os.path.basename(command[0]) != WORKER_ENTRYPOINT:
        return None
    rest = [*command[1:], *args]
    if rest and rest[0] == "--":
        rest = rest[1:]
    return rest


def injected_command(command: Sequence[str] | None, args: Sequence[str] | None) -> list[str]:
    """The training command of a container whose runtime the operator injects: command + args, except for a
    container written for the worker image (no command, or ``command: [ddp-worker, ...]``), whose args are the
    training command under that image's entrypoint. Empty when the container names no command at all."""
    command, args = [str(c) for c in command or []], [str(a) for a in args or []]
    if command and os.path.basename(command[0]) != WORKER_ENTRYPOINT:
        return [*command, *args]
    rest = [*command[1:], *args]
    return rest[1:] if rest and rest[0] == "--" else rest


_NNODES_RE = re.compile(r"^(\d+)(?::(\d+))?$")
_ENDPOINT_RE = re.compile(r"^[A-Za-z0-9.\-]+:\d{1,5}$")


class ContractError(ValueError):
    """The worker environment is incomplete or malformed; the message names the variable and the fix."""


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class WorkerEnv:
    """Everything a worker pod (or a local `ddpjob run` agent) is told through its environment."""

    job_name: str
    """DDPJob name."""
    namespace: str
    """DDPJob namespace (``"local"`` under ``ddpjob run``)."""
    job_uid: str
    """DDPJob UID; also the torchrun rendezvous id."""
    worker_index: int
    """Index of this worker pod."""
    min_nodes: int
    """Lower bound of torchrun ``--nnodes`` (equal to max_nodes for a fixed-size job)."""
    max_nodes: int
    """Upper bound of torchrun ``--nnodes``."""
    nproc_per_node: str
    """torchrun ``--nproc-per-node``."""
    rdzv_endpoint: str
    """``host:port`` of the rendezvous store."""
    max_restarts: int
    """torchrun ``--max-restarts``."""
    checkpoint_dir: str
    """Where checkpoints are kept."""
    rdzv_conf: str = "is_host=false"
    """torchrun ``--rdzv-conf``."""
    sigterm_budget_seconds: int = DEFAULT_SIGTERM_BUDGET_SECONDS
    """Seconds allowed for the final checkpoint after SIGTERM."""
    report_progress: bool = False
    """Whether rank 0 patches progress into the DDPJob's status."""
    checkpoint_keep: int = DEFAULT_CHECKPOINT_KEEP
    """How many valid checkpoints the library keeps (``spec.checkpoint.keep``)."""
    progress_file: str = ""
    """Local JSON progress file for ``ddpjob run``; empty (and not exported) in pods."""
    peer_timeout_seconds: int = DEFAULT_PEER_TIMEOUT_SECONDS
    """Seconds a silent peer agent is given before the others remove it and re-form (0: off)."""
    termination_log: str = ""
    """Where ``ddp-worker`` writes the root cause of a failure (the container's terminationMessagePath); empty:
    not exported, and ``ddp-worker`` uses DEFAULT_TERMINATION_LOG when that file exists."""

    @property
    def nnodes(self) -> str:
        """torchrun's ``--nnodes`` value."""
        if self.min_nodes == self.max_nodes:
            return str(self.max_nodes)
        return f"{self.min_nodes}:{self.max_nodes}"

    def to_env(self) -> dict[str, str]:
        """The variables to put into a worker's environment."""
        env = {
            PET_NNODES: self.nnodes,
            PET_NPROC_PER_NODE: self.nproc_per_node,
            PET_RDZV_BACKEND: "c10d",
            PET_RDZV_ENDPOINT: self.rdzv_endpoint,
            PET_RDZV_ID: self.job_uid,
            PET_RDZV_CONF: self.rdzv_conf,
            PET_MAX_RESTARTS: str(self.max_restarts),
            TORCH_DISABLE_SHARE_RDZV_TCP_STORE: "1",
            DDPJOB_NAME: self.job_name,
            DDPJOB_NAMESPACE: self.namespace,
            DDPJOB_UID: self.job_uid,
            DDPJOB_WORKER_INDEX: str(self.worker_index),
            DDPJOB_CHECKPOINT_DIR: self.checkpoint_dir,
            DDPJOB_SIGTERM_BUDGET_SECONDS: str(self.sigterm_budget_seconds),
            DDPJOB_REPORT_PROGRESS: "1" if self.report_progress else "0",
            DDPJOB_CHECKPOINT_KEEP: str(self.checkpoint_keep),
            DDPJOB_PEER_TIMEOUT_SECONDS: str(self.peer_timeout_seconds),
        }
        if self.progress_file:
            env[DDPJOB_PROGRESS_FILE] = self.progress_file
        if self.termination_log:
            env[DDPJOB_TERMINATION_LOG] = self.termination_log
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> WorkerEnv:
        """Parse and validate a worker environment; raise ContractError naming the first bad variable."""

        def need(name: str, hint: str) -> str:
            value = environ.get(name, "").strip()
            if not value:
                raise ContractError(f"{name} is not set: {hint}")
            return value

        def integer(name: str, hint: str, minimum: int = 0, default: int | None = None) -> int:
            raw = need(name, hint) if default is None else environ.get(name, "").strip() or str(default)
            try:
                value = int(raw)
            except ValueError:
                raise ContractError(f"{name}={raw!r} is not an integer: {hint}") from None
            if value < minimum:
                raise ContractError(f"{name}={raw!r} must be >= {minimum}: {hint}")
            return value

        op_hint = "the ddpjob operator sets it in every worker pod; outside a DDPJob use `ddpjob run job.yaml`"
        nnodes = need(PET_NNODES, "set it to N or MIN:MAX (torchrun --nnodes)")
        match = _NNODES_RE.match(nnodes)
        if not match:
            raise ContractError(f"{PET_NNODES}={nnodes!r} is malformed: use N or MIN:MAX, e.g. 2 or 1:4")
        lo = int(match.group(1))
        hi = int(match.group(2)) if match.group(2) else lo
        if lo < 1 or hi < lo:
            raise ContractError(f"{PET_NNODES}={nnodes!r} needs 1 <= MIN <= MAX")
        nproc = need(PET_NPROC_PER_NODE, "set it to auto, gpu, cpu or a positive integer")
        if nproc not in ("auto", "gpu", "cpu") and not (nproc.isdigit() and int(nproc) > 0):
            raise ContractError(f"{PET_NPROC_PER_NODE}={nproc!r} is invalid: use auto, gpu, cpu or a positive integer")
        backend = environ.get(PET_RDZV_BACKEND, "c10d")
        if backend != "c10d":
            raise ContractError(f"{PET_RDZV_BACKEND}={backend!r} is unsupported: ddpjob uses c10d")
        endpoint = need(PET_RDZV_ENDPOINT, f"set it to host:port of the rendezvous store; {op_hint}")
        if not _ENDPOINT_RE.match(endpoint) or not 0 < int(endpoint.rsplit(":", 1)[1]) < 65536:
            raise ContractError(f"{PET_RDZV_ENDPOINT}={endpoint!r} is malformed: use host:port, e.g. job-rdzv:29400")
        uid = need(PET_RDZV_ID, f"set it to a run-unique id (the DDPJob UID); {op_hint}")
        try:
            budget = int(environ.get(DDPJOB_SIGTERM_BUDGET_SECONDS, str(DEFAULT_SIGTERM_BUDGET_SECONDS)))
        except ValueError:
            raise ContractError(f"{DDPJOB_SIGTERM_BUDGET_SECONDS} must be an integer number of seconds") from None
        if budget < 1:
            raise ContractError(f"{DDPJOB_SIGTERM_BUDGET_SECONDS}={budget} must be >= 1 second")
        keep_raw = environ.get(DDPJOB_CHECKPOINT_KEEP, str(DEFAULT_CHECKPOINT_KEEP))
        if not keep_raw.isdigit() or int(keep_raw) < 1:
            raise ContractError(f"{DDPJOB_CHECKPOINT_KEEP}={keep_raw!r} must be a positive integer "
                                "(spec.checkpoint.keep)")
        return cls(
            job_name=need(DDPJOB_NAME, op_hint),
            namespace=need(DDPJOB_NAMESPACE, op_hint),
            job_uid=environ.get(DDPJOB_UID, uid),
            worker_index=integer(DDPJOB_WORKER_INDEX, op_hint),
            min_nodes=lo,
            max_nodes=hi,
            nproc_per_node=nproc,
            rdzv_endpoint=endpoint,
            max_restarts=integer(PET_MAX_RESTARTS, "set it to torchrun's --max-restarts, e.g. 3"),
            checkpoint_dir=need(DDPJOB_CHECKPOINT_DIR, "set it to a directory on the checkpoint volume"),
            rdzv_conf=environ.get(PET_RDZV_CONF, "is_host=false"),
            sigterm_budget_seconds=budget,
            report_progress=environ.get(DDPJOB_REPORT_PROGRESS, "0") == "1",
            checkpoint_keep=int(keep_raw),
            progress_file=environ.get(DDPJOB_PROGRESS_FILE, ""),
            peer_timeout_seconds=integer(DDPJOB_PEER_TIMEOUT_SECONDS, "0: off", default=DEFAULT_PEER_TIMEOUT_SECONDS),
            termination_log=environ.get(DDPJOB_TERMINATION_LOG, ""),
        )

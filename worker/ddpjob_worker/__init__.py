"""ddpjob worker: the runtime that runs around a training script in every worker pod, and the library the script
imports. The module paths are a contract (``python -m ddpjob_worker.launch``; scripts import
``ddpjob_worker.checkpoint``), so the two live side by side in this one package; this map says which is which.
Importing the package imports nothing (no torch): each module is imported on its own.

The library a training script imports (docs/checkpoints.md):
    checkpoint: ``Checkpointer``, ``CheckpointConfig``, ``TrainState``: atomic, checksummed, rotated checkpoints,
        exact resume, a final save on SIGTERM. The modules below are its parts; a script needs only this one.
    payload: what a checkpoint holds: ``TrainState`` and the state dicts of the model and its companions.
    preemption: the SIGTERM handler, its budget's watchdog, and the collective that spreads a SIGTERM.
    storage_api: the ``Storage`` Protocol a custom storage implements, and its records (``Manifest``, ``Fence``,
        ``CorruptCheckpoint``); imports nothing of the package.
    storage: ``LocalStorage``, step-N folders on a POSIX directory with a checksummed completion marker.
    fencing: incarnations, so a checkpoint a cut-off writer commits late is never resumed from.
    replicas: which rank writes each volume's copy, which step a resume uses, and the copy a peer sends.
    staging: asynchronous saves: host staging buffers, the writer thread, failures raised on every rank.
    rngstate: every RNG state a resume restores, and fresh streams after a world-size change.
    sampler: ``ElasticDistributedSampler``: resumes mid-epoch with any world size.
    globalbatch: ``plan_batches``: a global batch that stays fixed when the world size changes (torch-free).
    progress: ``ProgressReporter``: epoch, step, loss and the last checkpoint into the DDPJob's status.
    statusclient: the one Kubernetes call (a merge patch of ``status.progress``), standard library only.
    sender: the thread status patches go out on (progress, peerreport), so nothing waits for the API server.
    examples/: complete training scripts (charlm, the PyTorch DDP tutorial's).

The runtime that runs around a script (docs/worker.md), in the order a pod meets it:
    bootstrap: the injected runtime's first step in a user's image: can this Python run the runtime at all.
    entrypoint: ``ddp-worker``: validates the environment contract, waits for DNS, execs torchrun (launch).
    launch: ``python -m ddpjob_worker.launch``: torchrun in this process, with exit codes a restart policy reads.
    agent: torchrun's agent as a pod needs it (a failed agent leaves the rendezvous open for its replacement).
    warm: pre-started trainers, so a recovery does not pay for ``import torch``.
    recorded: runs the script under torchelastic's ``@record``; on rank 0 counts its optimizer steps.
    autoprogress: those counted steps as ``status.progress``, for a script that reports nothing itself.
    membership: whether this agent's group is still whole; removes a silent peer and restarts the group.
    peerwatch: notices a dead or cut-off peer within seconds, from inside the job.
    peerreport: tells the operator which peers were removed as silent, so it replaces them at once.
    restart_request: restarts in place that the operator asks for (torch-free; the operator imports it too).
    storekeeper: a lost rendezvous store does not stop a healthy group.
    storeclient: a TCPStore client for counters whose every call gives up after its timeout.
    rdzv: the job's rendezvous store (``python -m ddpjob_worker.rdzv``), served by storeserver, whose state
        (keys, queues, waiting clients) is storestate: pure Python, no torch.
    replication/: checkpoints of any framework copied to the job's other pods, and the object-store tier.
    objectstore: the object-store tier's S3 client.
    causes: a failure's root cause as one line (torch-free; the operator imports it too).
    termlog: that line as the container's termination message.
    redact: credentials out of messages that leave the pod (the operator imports it too).
    logs: rank-tagged logging.
    procs: process helpers for the local runner and the tests.

Shared by both sides:
    contract: the environment contract between the operator and the worker, defined once (the operator imports it).
    compat/: every private or version-dependent name of torch the runtime touches, probed once at start.
"""

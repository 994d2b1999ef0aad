"""torchrun with exit codes a restart policy can use: ``python -m ddpjob_worker.launch`` takes torchrun's
arguments and runs ``torch.distributed.run`` in this very process (``ddp-worker`` execs it, so it is PID 1).

Plain torchrun exits 1 for every failure, which the operator's default policy (1..127 permanent, >=128
retryable) would read as a permanent error even when the pod was merely SIGTERMed or a peer died. Here the
container exits with the root cause, and writes it as one line to the termination log:

- the first failed worker's own exit code (128+N for a worker killed by signal N, 143 for a worker that
  checkpointed after SIGTERM, 78 for a broken contract, 1 for an exception in the script);
- EXIT_PEER_LOST when every failed worker failed because it lost a peer (the cause is another pod);
- EXIT_RENDEZVOUS_LOST for any rendezvous failure (store lost, timed out, closed): a replaced pod rejoins;
- 128+N when the agent itself got signal N.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from ddpjob_worker import causes, contract, replication, termlog, warm
from ddpjob_worker.logs import get_logger

log = get_logger("launch")

#: Seconds the agent gives its workers between SIGTERM and SIGKILL on top of the checkpoint budget.
SHUTDOWN_MARGIN_SECONDS = 5
#: Seconds the agent may spend, once its workers ended, uploading complete checkpoints to the object store (the
#: operator's grace period leaves 30 s beyond the checkpoint budget).
FLUSH_SECONDS = 20.0


def exit_code_for_worker(exitcode: int) -> int:
    """A container exit code for a worker's: negative (killed by signal N) -> 128+N, clamped to 1..255."""
    if exitcode < 0:
        return min(255, 128 - exitcode)
    return exitcode if 0 < exitcode < 256 else 1


def shutdown_timeout(explicit: int | None, environ: Mapping[str, str]) -> int:
    """Seconds between SIGTERM and SIGKILL for the workers: the checkpoint budget plus a margin, or more if the
    user asked for more (``--shutdown-timeout`` / TORCH_ELASTIC_SHUTDOWN_TIMEOUT)."""
    raw = environ.get(contract.DDPJOB_SIGTERM_BUDGET_SECONDS, "")
    budget = int(raw) if raw.isdigit() else contract.DEFAULT_SIGTERM_BUDGET_SECONDS
    if explicit is None:
        env_value = environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "")
        explicit = int(env_value) if env_value.isdigit() else None
    return max(budget + SHUTDOWN_MARGIN_SECONDS, explicit or 0)


def _signal_name(exitcode: int) -> str:
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def describe_failure(rank: int, failure: Any) -> str:
    """``<ExcType>: <message> (rank R, exit code C)`` for a failed worker (a ProcessFailure)."""
    from ddpjob_worker.agent import failure_text, has_error_file

    code = exit_code_for_worker(failure.exitcode)
    if failure.exitcode < 0:
        cause = f"killed by signal {_signal_name(failure.exitcode)}"
    elif has_error_file(failure):
        cause = causes.condense(failure_text(failure), 400)
    else:
        cause = f"exited with code {failure.exitcode} without an error file"
    return f"{cause} (rank {rank}, exit code {code})"


def child_failed(err: Any) -> int:
    """Container exit code for a ChildFailedError; logs it and writes the termination message."""
    from torch.distributed.elastic.multiprocessing.errors import get_error_handler

    from ddpjob_worker.agent import has_error_file, peer_loss

    rank, failure = err.get_first_failure()
    line = describe_failure(rank, failure)
    code = contract.EXIT_PEER_LOST if peer_loss(err.failures) else exit_code_for_worker(failure.exitcode)
    log.error("training failed: %s; container exits %d%s", line, code,
              " (a peer was lost, not this pod's fault)" if code == contract.EXIT_PEER_LOST else "")
    termlog.write_termination_log(line)
    if has_error_file(failure):
        # What torchrun's @record main does: the agent's TORCHELASTIC_ERROR_FILE gets the root cause's file.
        with contextlib.suppress(Exception):
            get_error_handler().dump_error_file(failure.error_file, failure.exitcode)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run torchrun with ``argv``; return the container exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # Before the first torch import: the trainers' imports then overlap the agent's (ddpjob_worker.warm).
    warm.prestart_at_launch(argv)
    from torch.distributed.run import parse_args, run

    from ddpjob_worker import agent, compat

    args = parse_args(argv)  # type: ignore[no-untyped-call]
    # The agent SIGKILLs the workers this long after forwarding a SIGTERM: it must cover the final checkpoint.
    # torchrun carries it from its --shutdown-timeout where it has one (torch 2.15); PodAgent applies it otherwise.
    seconds = shutdown_timeout(compat.requested_shutdown_timeout(args), os.environ)
    agent.install(seconds)
    compat.set_shutdown_timeout(args, seconds)
    runtime = replication.start(os.environ)
    try:
        return _run(args, run)
    finally:
        if runtime is not None:
            runtime.close(FLUSH_SECONDS)


def _run(args: Any, run: Any) -> int:
    """torchrun's ``run(args)``, and the container exit code of how it ended."""
    from torch.distributed import DistNetworkError, DistStoreError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    from ddpjob_worker.replication.groupsync import SyncFailed

    try:
        run(args)
    except ChildFailedError as err:
        return child_failed(err)
    except (RendezvousError, DistNetworkError, DistStoreError) as err:
        # The agent's only network peer is the rendezvous store: whatever went wrong there, a replacement pod
        # can join the (recreated) store, so the exit must be retryable.
        line = f"{causes.condense(f'{type(err).__name__}: {err}', 400)} (rendezvous lost, exit code " \
               f"{contract.EXIT_RENDEZVOUS_LOST})"
        log.error("lost the rendezvous: %s; exiting so the pod is replaced and rejoins", line)
        termlog.write_termination_log(line)
        return contract.EXIT_RENDEZVOUS_LOST
    except SyncFailed as err:
        line = f"{causes.condense(str(err), 400)} (exit code {contract.EXIT_CHECKPOINT_SYNC})"
        log.error("%s; exiting so the group re-forms", line)
        termlog.write_termination_log(line)
        return contract.EXIT_CHECKPOINT_SYNC
    except SignalException as err:
        code = 128 + int(err.sigval)
        log.warning("agent got %s; workers were stopped, exiting %d", err.sigval.name, code)
        termlog.write_termination_log(f"agent received {err.sigval.name}; workers stopped (exit code {code})")
        return code
    return 0

def leave(code: int) -> NoReturn:
    """Exit with ``code`` without the interpreter's teardown, which can abort the agent: torch's keep-alive and the
    store keeper's threads may still be inside torch's C++ (a store call to a lost store), and the finalizing
    interpreter ends such a thread with an unwind that C++ turns into std::terminate (SIGABRT: exit -6 instead of
    143, seen in CI on 2026-12-06). Everything the agent owns has ended by now (its workers, the replication
    runtime); only the logs and the standard streams need flushing."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    leave(main())

"""torchrun with exit codes a restart policy can use: ``python -m ddpjob_worker.launch`` takes torchrun's
arguments and runs ``torch.distributed.run`` in this very process (``ddp-worker`` execs it, so it is PID 1).

Plain torchrun exits 1 for every failure (a traceback from ChildFailedError or SignalException), which the
operator's default policy (1..127 permanent, >=128 retryable) would read as a permanent error even when the
pod was merely SIGTERMed or a worker was OOM-killed. Here the container exits with the root cause instead:
128+N when the agent got signal N, the first failed worker's own exit code otherwise (128+N for a worker
killed by signal N, 143 for a worker that checkpointed after SIGTERM, 78 for a broken contract), and
EXIT_RENDEZVOUS_LOST when the agent lost its rendezvous store (the store pod was deleted or restarted): torchrun
would exit 1, which the default policy reads as permanent, while a replaced pod joins the new store and resumes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from ddpjob_worker import contract
from ddpjob_worker.logs import get_logger

log = get_logger("launch")

#: Container exit code when the agent cannot reach the rendezvous store; retryable under the default policy
#: (>= 128) so the operator replaces the pod instead of failing the job.
EXIT_RENDEZVOUS_LOST = 200

#: Seconds the agent gives its workers between SIGTERM and SIGKILL on top of the checkpoint budget.
_SHUTDOWN_MARGIN_SECONDS = 5


def exit_code_for_worker(exitcode: int) -> int:
    """A container exit code for a worker's: negative (killed by signal N) -> 128+N, clamped to 1..255."""
    if exitcode < 0:
        return min(255, 128 - exitcode)
    return exitcode if 0 < exitcode < 256 else 1


def _give_workers_the_budget(seconds: int) -> None:
    """torchrun's agent SIGKILLs its workers 30 s after forwarding SIGTERM, whatever the checkpoint budget; let
    it wait for the budget instead (the pod's grace period must still cover it, the operator sets that)."""
    try:
        import torch.distributed.launcher.api as launcher_api
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    except ImportError:  # pragma: no cover - torch layout changed; the 30 s default stays
        return

    class _Agent(LocalElasticAgent):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("shutdown_timeout", seconds)
            super().__init__(*args, **kwargs)

    if getattr(launcher_api, "LocalElasticAgent", None) is LocalElasticAgent:
        setattr(launcher_api, "LocalElasticAgent", _Agent)  # noqa: B010 - the module does not export the name


def main(argv: Sequence[str] | None = None) -> int:
    """Run torchrun with ``argv``; return the container exit code."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousStateError
    from torch.distributed.run import parse_args, run

    budget = os.environ.get(contract.DDPJOB_SIGTERM_BUDGET_SECONDS, str(contract.DEFAULT_SIGTERM_BUDGET_SECONDS))
    _give_workers_the_budget(int(budget) + _SHUTDOWN_MARGIN_SECONDS if budget.isdigit() else 30)
    args = parse_args(list(sys.argv[1:] if argv is None else argv))  # type: ignore[no-untyped-call]
    try:
        run(args)  # type: ignore[no-untyped-call]
    except ChildFailedError as err:
        rank, failure = err.get_first_failure()
        code = exit_code_for_worker(failure.exitcode)
        log.error("training failed: rank %s exited %s (root cause; container exits %d); see %s",
                  rank, failure.exitcode, code, failure.error_file or "the worker's log")
        return code
    except (RendezvousConnectionError, RendezvousStateError) as err:
        log.error("lost the rendezvous store (%s: %s); exiting %d so the pod is replaced and rejoins",
                  type(err).__name__, err, EXIT_RENDEZVOUS_LOST)
        return EXIT_RENDEZVOUS_LOST
    except SignalException as err:
        code = 128 + int(err.sigval)
        log.warning("agent got %s; workers were stopped, exiting %d", err.sigval.name, code)
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main())

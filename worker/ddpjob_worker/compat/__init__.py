"""Every private or version-dependent name of torch that the worker runtime touches, each with its fallback.

The runtime supports torch 2.6 to 2.15 (``make test-compat`` runs its tests under each release of
TORCH_COMPAT_VERSIONS in hack/versions.env) and reaches into torchrun's agent, launcher and c10d rendezvous,
whose internals change between releases. Keeping those names here means a torch upgrade breaks one module, and
``probe`` tells at the agent's start, in one log line, which behaviour this torch gets. Nothing here imports
torch at module level: launch starts the pre-started trainers before its first torch import.

What differs between releases (read in their sources, torch/distributed/...):

- ``--shutdown-timeout`` (run.py), LaunchConfig.shutdown_timeout and a ``timeout`` parameter of the agent's
  ``_shutdown``: torch 2.15, not 2.6 or 2.10. Without them the agent closes its workers 30 s after forwarding a
  SIGTERM, whatever the checkpoint budget; PodAgent then closes them itself with the budget (``close_workers``).
- ``numa_options`` of get_subprocess_handler: 2.10 and 2.15, not 2.6. What torchrun passes is passed on as is.
- LocalElasticAgent._shutdown closes the rendezvous itself (2.6, not 2.10 or 2.15), after a failure and after a
  SIGTERM too: the pod that replaces this one would find it closed. PodAgent detaches it (``detach_rendezvous``).
"""

from __future__ import annotations

import dataclasses
import inspect
import signal
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ddpjob_worker.compat import rendezvous as _rendezvous
from ddpjob_worker.logs import get_logger

log = get_logger("compat")

# The rendezvous handler's names live in compat/rendezvous.py; they are this module's as much as the rest.
check_reconnectable = _rendezvous.check_reconnectable
connect_store = _rendezvous.connect_store
evict = _rendezvous.evict
handler_state = _rendezvous.handler_state
handler_store = _rendezvous.handler_store
heartbeat_lock = _rendezvous.heartbeat_lock
leave_round = _rendezvous.leave_round
rendezvous_settings = _rendezvous.rendezvous_settings
renew_node = _rendezvous.renew_node
round_store = _rendezvous.round_store
set_poll_interval = _rendezvous.set_poll_interval
shorten_rendezvous_poll = _rendezvous.shorten_rendezvous_poll
store_uses_libuv = _rendezvous.store_uses_libuv
switch_store = _rendezvous.switch_store
this_node = _rendezvous.this_node


#: Private modules DistributedDataParallel's constructor imports lazily (torch._dynamo: 908 modules, sympy
#: included) and a pre-started trainer imports ahead of time (ddpjob_worker.warm); one a torch lacks is skipped.
DDP_LAZY_IMPORTS = ("torch._dynamo",)

#: LocalElasticAgent's private methods that PodAgent (ddpjob_worker.agent) overrides: a torch that renamed one
#: would skip the override silently, so the pod agent is then not installed at all (plain torchrun, said loudly).
AGENT_OVERRIDES = ("_rendezvous", "_monitor_workers", "_exit_barrier", "_shutdown")


@dataclasses.dataclass(frozen=True, slots=True)
class Capabilities:
    """What this torch offers the runtime (each False has a fallback; ``describe`` says which is used)."""

    #: torch's own version string, e.g. 2.6.0+cu124.
    torch: str
    #: torchrun takes --shutdown-timeout and its agent closes the workers with it after a SIGTERM.
    shutdown_timeout: bool
    #: torchrun's SubprocessHandler takes numa_options (NUMA-bound workers start cold: binding is set at exec).
    numa_options: bool
    #: LocalElasticAgent._shutdown shuts the rendezvous down itself (PodAgent detaches it).
    agent_closes_rendezvous: bool
    #: launch_agent looks LocalElasticAgent up in its module's globals (PodAgent can take its place).
    agent_class: bool
    #: Workers are started through get_subprocess_handler, a SubprocessHandler with a _popen (pre-started trainers).
    subprocess_handler: bool
    #: SimpleElasticAgent counts restarts in _remaining_restarts (a peer's death can give one back).
    restart_refund: bool
    #: DynamicRendezvousHandler can leave its round (exit op, heartbeats, deadlines).
    leave_round: bool
    #: The rendezvous poll (_delay) and the state cache (_cache_duration) can be shortened.
    poll_tuning: bool
    #: The handler's store and state can be switched to a new store (ddpjob_worker.storekeeper).
    store_reconnect: bool
    #: A silent peer can be removed from the round the way torch's heartbeat sweep removes it (peerwatch).
    peer_eviction: bool = False
    #: The handler's node descriptor can be made unique per pod incarnation (its pid field: ``renew_node``).
    unique_node: bool = False

    def describe(self) -> str:
        """The one log line, e.g. ``torch 2.6.0: shutdown budget via agent override, numa_options no, ...``."""
        def yes(flag: bool) -> str:
            return "yes" if flag else "no"

        return ", ".join([
            f"torch {self.torch}: shutdown budget via "
            + ("torchrun --shutdown-timeout" if self.shutdown_timeout else "agent override"),
            f"numa_options {yes(self.numa_options)}",
            "agent closes the rendezvous: " + ("yes, detached" if self.agent_closes_rendezvous else "no"),
            f"pod agent {yes(self.agent_class)}",
            "pre-started trainers " + ("yes" if self.subprocess_handler else "no (cold starts)"),
            f"restart refund {yes(self.restart_refund)}",
            f"leave round {yes(self.leave_round)}",
            f"fast polls {yes(self.poll_tuning)}",
            f"store reconnect {yes(self.store_reconnect)}",
            f"peer eviction {yes(self.peer_eviction)}",
            f"unique node {yes(self.unique_node)}",
        ])


def _checked(check: Callable[[], bool]) -> bool:
    """A capability check that fails closed: a torch that moved the name gets the fallback."""
    try:
        return bool(check())
    except Exception:  # ImportError, AttributeError, TypeError, ValueError from inspect: all "not here"
        return False


def assigns(function: Any, names: Iterable[str]) -> bool:
    """Whether ``function``'s code uses every attribute name of ``names`` (instance attributes exist only once an
    object is built; the names its ``__init__`` stores are in its code object)."""
    code = inspect.unwrap(function).__code__
    return set(names) <= set(code.co_names)


def takes(function: Any, parameter: str) -> bool:
    """Whether ``function`` has a parameter of that name."""
    return parameter in inspect.signature(function).parameters


def _has_shutdown_timeout() -> bool:
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.launcher.api import LaunchConfig
    from torch.distributed.run import get_args_parser

    # parse_known_args: an unknown option lands in the extras instead of exiting.
    parsed, _ = get_args_parser().parse_known_args(["--shutdown-timeout", "7", "train.py"])
    fields = {f.name for f in dataclasses.fields(LaunchConfig)}
    return (getattr(parsed, "shutdown_timeout", None) == 7 and "shutdown_timeout" in fields
            and takes(LocalElasticAgent._shutdown, "timeout"))


def _probe() -> Capabilities:
    import torch
    import torch.distributed.elastic.multiprocessing.api as mp_module
    import torch.distributed.launcher.api as launcher_module
    from torch.distributed.elastic.agent.server import api as agent_api
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous
    from torch.distributed.elastic.rendezvous import utils as utils_module

    # Any: these are the names a release may lack, and every use below is a check that fails closed.
    mp_api: Any = mp_module
    launcher_api: Any = launcher_module
    dr: Any = dynamic_rendezvous
    rdzv_utils: Any = utils_module
    handler_cls = dr.DynamicRendezvousHandler

    def holder_assigns(*names: str) -> bool:
        return assigns(dr._BackendRendezvousStateHolder.__init__, names)

    return Capabilities(
        torch=str(torch.__version__),
        shutdown_timeout=_checked(_has_shutdown_timeout),
        numa_options=_checked(lambda: takes(_subprocess_handler_class(), "numa_options")),
        agent_closes_rendezvous=_checked(lambda: assigns(LocalElasticAgent._shutdown, ["_rdzv_handler", "shutdown"])),
        agent_class=_checked(lambda: issubclass(launcher_api.LocalElasticAgent, LocalElasticAgent) and all(
            callable(getattr(LocalElasticAgent, m)) for m in AGENT_OVERRIDES)),
        subprocess_handler=_checked(lambda: callable(mp_api.get_subprocess_handler) and hasattr(
            _subprocess_handler_class(), "_popen")),
        restart_refund=_checked(lambda: assigns(agent_api.SimpleElasticAgent.__init__, ["_remaining_restarts"])),
        leave_round=_checked(lambda: hasattr(dr, "_RendezvousExitOp") and assigns(
            handler_cls.__init__, ["_op_executor", "_settings"]) and all(
            hasattr(handler_cls, m) for m in ("_stop_heartbeats", "_get_deadline"))),
        poll_tuning=_checked(lambda: callable(dr._delay) and callable(rdzv_utils._delay)
                             and holder_assigns("_cache_duration")),
        store_reconnect=_checked(lambda: assigns(handler_cls.__init__, ["_store", "_state_holder", "_heartbeat_lock"])
                                 and holder_assigns("_backend", "_state", "_token", "_dirty", "_last_sync_time")),
        peer_eviction=_checked(lambda: assigns(handler_cls.__init__, ["_this_node", "_state_holder", "_heartbeat_lock"])
                               and holder_assigns("_last_sync_time") and all(
            callable(getattr(dr._BackendRendezvousStateHolder, m, None)) for m in ("_sanitize", "mark_dirty", "sync"))),
        unique_node=_checked(lambda: assigns(handler_cls.__init__, ["_this_node", "_op_executor"])
                             and assigns(dr._DistributedRendezvousOpExecutor.__init__, ["_node"])
                             and "pid" in {f.name for f in dataclasses.fields(dr._NodeDesc)}),
    )


_capabilities: Capabilities | None = None


def capabilities() -> Capabilities:
    """This torch's capabilities, probed on the first call."""
    global _capabilities
    if _capabilities is None:
        _capabilities = _probe()
    return _capabilities


def log_capabilities() -> Capabilities:
    """Probe and log the result as one line (the agent does this once, as it starts)."""
    caps = capabilities()
    log.info("%s", caps.describe())
    return caps


# --- the trainer's process groups ------------------------------------------------------------------------------

#: Every process group the script destroyed: kept referenced, never freed, until the trainer leaves by os._exit.
_kept_groups: list[Any] = []
#: The first release whose trainers were never seen hanging at their end (make test-compat: about one end in three
#: on 2.6 and 2.10, none on 2.15). Older ones get keep_process_groups, and a trainer that succeeded leaves by
#: os._exit as a failed one does (recorded.cli).
GLOO_TEARDOWN_SAFE_FROM = (2, 15)


def keep_group(group: Any) -> None:
    """Never free ``group`` (a gloo group the checkpoint library made for itself): on the torches of
    keep_process_groups, freeing it, as the last reference goes, can hang the trainer where it stands. A trainer
    makes at most a few (one per resume that fetches a checkpoint from a peer)."""
    _kept_groups.append(group)


def gloo_teardown_may_hang() -> bool:
    """Whether this torch is older than GLOO_TEARDOWN_SAFE_FROM (an unreadable version counts as older)."""
    import torch

    from ddpjob_worker.bootstrap import release

    found = release(str(torch.__version__))
    return found is None or found < GLOO_TEARDOWN_SAFE_FROM


def keep_process_groups() -> None:
    """Make destroy_process_group keep a reference to what it removes. A gloo group freed on a thread holding the
    GIL joins its worker threads, and one of those may be waiting for the GIL to free the last collective's
    tensors: the trainer hangs at its end (torch 2.6 and 2.10, about one exit in three in tests/worker; the DDP
    tutorial's order, destroy_process_group and then the model freed, is such an end). Kept alive, the group is
    never freed: the trainer leaves by os._exit (recorded.leave), so neither is it at interpreter exit."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    original = c10d.destroy_process_group
    if getattr(original, "keeps_groups", False):
        return

    def destroy_process_group(group: Any = None) -> None:
        world = getattr(c10d, "_world", None)
        _kept_groups.extend(list(getattr(world, "pg_map", {})) if group is None else [group])
        original(group)

    destroy_process_group.__doc__ = original.__doc__
    destroy_process_group.keeps_groups = True  # type: ignore[attr-defined]
    c10d.destroy_process_group = destroy_process_group
    dist.destroy_process_group = destroy_process_group


# --- torchrun's launcher and agent -----------------------------------------------------------------------------


def install_agent_class(cls: type) -> bool:
    """Make launch_agent build ``cls`` (it looks LocalElasticAgent up in its module's globals). False, and the
    name left alone, when this torch's launcher no longer builds the LocalElasticAgent that ``cls`` extends."""
    import torch.distributed.launcher.api as launcher_api

    current = getattr(launcher_api, "LocalElasticAgent", None)
    if current is cls:
        return True
    if not capabilities().agent_class or current is None or not issubclass(cls, current):
        return False
    setattr(launcher_api, "LocalElasticAgent", cls)  # noqa: B010 - the module does not export the name
    return True


def requested_shutdown_timeout(args: Any) -> int | None:
    """The --shutdown-timeout given to torchrun, where it has that option."""
    value = getattr(args, "shutdown_timeout", None)
    return value if isinstance(value, int) else None


def set_shutdown_timeout(args: Any, seconds: int) -> bool:
    """Put the seconds between SIGTERM and SIGKILL into torchrun's parsed arguments where torchrun has the option
    (launch_agent hands it to the agent); False where the agent must apply it itself (``close_workers``)."""
    if not capabilities().shutdown_timeout:
        return False
    args.shutdown_timeout = seconds
    return True


def signalled() -> bool:
    """Whether the agent is shutting down because it got a signal: SimpleElasticAgent.run calls _shutdown from
    its ``except SignalException`` block, and only there (a restart or the end of a run has no such exception)."""
    return is_signal(sys.exc_info()[1])


def is_signal(err: BaseException | None) -> bool:
    """Whether ``err`` is torchrun's SignalException: the agent's SIGTERM handler raises it on the main thread
    wherever that thread is, so a broad ``except Exception`` there must let it through, or the pod's SIGTERM is
    lost and its trainers train on until the kubelet's SIGKILL."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    return isinstance(err, SignalException)


def close_workers(agent: Any, death_sig: signal.Signals, timeout: int) -> None:
    """Send ``death_sig`` to the agent's workers and SIGKILL those still alive ``timeout`` seconds later (what
    torch 2.15's agent does with --shutdown-timeout; older ones wait a fixed 30 s). Their own _shutdown, called
    next, then finds them gone."""
    pcontext = getattr(agent, "_pcontext", None)
    if pcontext is not None:
        pcontext.close(death_sig, timeout)


def detach_rendezvous(agent: Any) -> None:
    """Stop LocalElasticAgent._shutdown (torch 2.6) from shutting the rendezvous down: launch_agent still closes it
    after a success, through the spec's handler, and leaves it open after a failure or a signal."""
    if hasattr(agent, "_rdzv_handler"):
        agent._rdzv_handler = None


def refund_restart(agent: Any) -> bool:
    """Give back the restart _invoke_run takes next; False when this torch counts restarts differently."""
    if not isinstance(getattr(agent, "_remaining_restarts", None), int):
        return False
    agent._remaining_restarts += 1
    return True


def set_agent_store(agent: Any, store: Any) -> None:
    """The store the agent's exit barrier uses (SimpleElasticAgent._store)."""
    agent._store = store


# --- how torchrun starts workers -------------------------------------------------------------------------------


def _subprocess_handler_class() -> type:
    from torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler import SubprocessHandler

    return SubprocessHandler


def install_subprocess_handler(factory: Callable[..., Any]) -> Callable[..., Any] | None:
    """Make torchrun start binary workers through ``factory``; returns the function it replaced (the factory's
    fallback), or None when this torch starts them some other way (every worker then starts cold)."""
    import torch.distributed.elastic.multiprocessing.api as mp_module

    mp_api: Any = mp_module  # the name is not exported
    if not capabilities().subprocess_handler:
        return None
    current: Callable[..., Any] = mp_api.get_subprocess_handler
    if current is not factory:
        setattr(mp_api, "get_subprocess_handler", factory)  # noqa: B010 - module global, not exported
    return current


def adopted_handler(proc: Any, local_rank: int) -> Any:
    """torchrun's SubprocessHandler around an already running process: its __init__ starts the process through
    ``_popen``, which here returns ``proc`` (so poll, close and the signals are torch's own)."""
    base = _subprocess_handler_class()

    class Adopted(base):  # type: ignore[valid-type, misc]
        def _popen(self, args: Any, env: Any) -> Any:
            return proc

    options = {"numa_options": None} if takes(base, "numa_options") else {}
    return Adopted(entrypoint=str(proc.args[0]), args=tuple(proc.args[1:]), env={}, stdout=None, stderr=None,
                   local_rank_id=local_rank, **options)


def substitute_local_rank(args: Sequence[Any], local_rank: int) -> list[str]:
    """torchrun's worker arguments for ``local_rank`` (``${local_rank}`` replaced, as its launcher does)."""
    from torch.distributed.elastic.utils import macros  # type: ignore[attr-defined]

    return [str(a) for a in macros.substitute(list(args), str(local_rank))]

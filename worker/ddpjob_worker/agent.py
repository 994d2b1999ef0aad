"""torchrun's agent (LocalElasticAgent) as a pod needs it: a failed agent leaves the rendezvous open for the pod
that replaces it, and a peer's death does not use up this pod's restarts. Imports torch; launch installs it."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Mapping
from typing import Any

from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
from torch.distributed.elastic.rendezvous.api import RendezvousClosedError

from ddpjob_worker import causes, compat, contract, peerreport, replication, restart_request, storekeeper, warm
from ddpjob_worker.logs import get_logger
from ddpjob_worker.membership import Membership
from ddpjob_worker.storekeeper import StoreKeeper

log = get_logger("agent")


def has_error_file(failure: ProcessFailure) -> bool:
    """Whether the worker wrote a torchelastic error file (torchelastic fills in a placeholder otherwise)."""
    return bool(failure.error_file) and os.path.isfile(failure.error_file)


def failure_text(failure: ProcessFailure) -> str:
    """What a failed worker left behind: its error file's JSON when it wrote one, else torchelastic's message."""
    if has_error_file(failure):
        return json.dumps(failure.error_file_data)
    message: Any = failure.message
    return message if isinstance(message, str) else json.dumps(message)


def peer_loss(failures: Mapping[int, ProcessFailure]) -> bool:
    """True when every failed worker failed because it lost a peer: the group is a casualty, not the cause (a
    single failure of this pod's own code, or a worker killed by a signal, makes it False)."""
    return bool(failures) and all(causes.is_peer_loss(failure_text(f)) for f in failures.values())


class _KeepOpen:
    """The rendezvous handler with a no-op ``shutdown``. launch_agent shuts the handler down after every run
    that did not end by a signal, which *closes* the rendezvous of the run id for good: the pod that replaces a
    failed one would get RendezvousClosedError and the job could never recover. Only success may close it."""

    def __init__(self, handler: Any) -> None:
        self._handler = handler

    def shutdown(self) -> bool:
        log.info("agent failed: leaving rendezvous %s open for the pod that replaces this one",
                 self._handler.get_run_id())
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handler, name)


def leave_round(handler: Any) -> None:
    """Take this node out of the current rendezvous round, as torchrun's own re-rendezvous does first.

    An agent that exits (SIGTERM from a pod deletion, restarts used up) otherwise stays a participant of the
    finished round until its heartbeats are judged lost (keep_alive_interval x keep_alive_max_attempt, 15 s by
    default), and no new round can start before every participant has left: the survivors, and a hot spare,
    would wait that long for a pod that is already gone. Private API of DynamicRendezvousHandler (c10d); any
    other handler, or a torch that changed it, keeps the old behaviour, said once in the log."""
    try:
        compat.leave_round(handler)
        log.info("left the rendezvous round: the others re-form the group without waiting for this pod")
    except Exception as err:  # best effort: the heartbeat expiry still removes this node, only later
        log.warning("could not leave the rendezvous round (%s: %s); if the store is still up, the other pods "
                    "wait for this pod's heartbeat to expire", type(err).__name__, err)


def unique_node(handler: Any) -> None:
    """Make this agent a participant of its own in the rendezvous, not one shared with every other incarnation
    of its pod (compat.renew_node says how they collided). Without it, a cut-off pod's old agent, stopped once its
    node is back, takes its replacement out of the round as it leaves; the replacement's later loss then goes
    unreported and the job waits for Kubernetes to call its node NotReady. The node's id carries the pod's UID: a
    survivor's report of this node, once silent, names this very pod (ddpjob_worker.peerreport)."""
    if not compat.capabilities().unique_node:
        return  # said in the capability line; the collision needs a pod replaced while its old agent lives
    try:
        node = compat.renew_node(handler, peerreport.node_id(os.environ))
    except AttributeError as err:  # another kind of handler (static, etcd): it has its own identities
        log.info("rendezvous node left as torch named it (%s): %s", type(handler).__name__, err)
        return
    log.info("rendezvous node %s", node)


def join_timeout(handler: Any) -> float:
    """Seconds a rendezvous join may take (torchrun's ``join_timeout``, 600 s by default)."""
    timeout = getattr(getattr(compat.rendezvous_settings(handler), "timeout", None), "join", None)
    return timeout.total_seconds() if timeout is not None else 600.0


def fixed_size(handler: Any) -> bool:
    """Whether the rendezvous has min_nodes == max_nodes (a fixed-size job)."""
    settings = compat.rendezvous_settings(handler)
    return settings is not None and getattr(settings, "min_nodes", 0) == getattr(settings, "max_nodes", -1)


class PodAgent(LocalElasticAgent):
    """LocalElasticAgent that keeps the rendezvous open on failure, leaves the round when it exits, restarts for
    free after a peer loss, never restarts a full fixed-size group for a waiting node (a hot spare), keeps a
    healthy group training when the rendezvous store is lost (ddpjob_worker.storekeeper), and starts its workers
    from pre-started trainers (ddpjob_worker.warm), and gives its workers the SIGTERM budget on any torch."""

    def __init__(self, spec: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(spec, *args, **kwargs)
        handler = spec.rdzv_handler
        unique_node(handler)
        if compat.capabilities().agent_closes_rendezvous:
            # torch 2.6 closes it on every shutdown that is not a restart, a SIGTERM included: only success may.
            compat.detach_rendezvous(self)
        self._keeper = StoreKeeper(handler)
        self._request_file = restart_request.request_file(os.environ)
        self._next_request_check = 0.0
        self._known_request: int | None = None  # the newest incident whose restart request this agent saw
        self._membership: Membership | None = None
        if hasattr(handler, "num_nodes_waiting"):
            handler.num_nodes_waiting = self._guarded_waiting(handler.num_nodes_waiting, fixed_size(handler))
        tune_polls(handler)
        # One waiting trainer per local rank, importing torch while this agent waits for the others.
        warm.prestart(spec.entrypoint, spec.args, spec.local_world_size)

    def _guarded_waiting(self, waiting: Callable[[], int], fixed: bool) -> Callable[[], int]:
        """num_nodes_waiting as the monitor loop calls it every interval: a lost store is not a reason to stop a
        healthy group (ddpjob_worker.storekeeper), and a fixed-size group never restarts for a waiting node.

        torchrun restarts a healthy group whenever a node waits, so that it can join; a fixed-size group is full
        whenever it runs, so the restart only reshuffles who trains. With hot spares, or a replaced pod that
        arrives while a round forms, that churn cost several restarts per fault. The call itself stays: it
        syncs with the store, and that is how a running agent learns that the store is gone."""
        keeper = self._keeper

        def guarded() -> int:
            if keeper.lost_since is not None:
                if not keeper.try_reconnect():
                    return 0  # never the old client again: to a lost node it blocks for its whole timeout
                compat.set_agent_store(self, self._keeper_store())
            try:
                count = waiting()
            except Exception as err:
                if not (keeper.usable and storekeeper.is_store_loss(err)):
                    raise
                keeper.lost(err)
                return 0
            return 0 if fixed else count

        return guarded

    def _keeper_store(self) -> Any:
        """The store of the current round on the new connection (the exit barrier at the end uses it)."""
        return compat.round_store(self.get_worker_group().spec.rdzv_handler)

    def run(self, role: str = "default") -> RunResult:
        try:
            result: RunResult = super().run(role)
        except RendezvousClosedError:
            # Closed before this pod joined (it started late: a replacement, a restarted container). Only success
            # closes it (_KeepOpen), so the job is done without this pod, as for a spare that waited (below); exit
            # 200 ("rendezvous lost") would call for a replacement of a pod of a finished job.
            log.info("the rendezvous was closed before this pod joined: the job is done")
            return RunResult(state=WorkerState.SUCCEEDED)
        except BaseException:
            if self._keeper.lost_since is None:  # the old client of a lost store would block for its timeout
                leave_round(self.get_worker_group().spec.rdzv_handler)
            self._keep_rendezvous_open()
            raise
        finally:
            warm.POOL.close()
            self._watch_membership(None, final=True)
        if result is None:
            # torchrun's run() returns nothing when the rendezvous was closed while this node waited in the
            # redundancy list: the job finished without needing this hot spare, which then exits 0 like a worker.
            log.info("the rendezvous closed while this pod waited as a hot spare: the job is done")
            return RunResult(state=WorkerState.SUCCEEDED)
        if result.is_failed():
            if self._keeper.lost_since is None:
                leave_round(self.get_worker_group().spec.rdzv_handler)
            self._keep_rendezvous_open()
        return result

    def _keep_rendezvous_open(self) -> None:
        spec = self.get_worker_group().spec
        if not isinstance(spec.rdzv_handler, _KeepOpen):
            # launch_agent's finally calls shutdown() through this same spec object.
            spec.rdzv_handler = _KeepOpen(spec.rdzv_handler)  # type: ignore[assignment]

    def _rendezvous(self, worker_group: WorkerGroup) -> None:
        deadline: float | None = None
        while True:
            try:
                super()._rendezvous(worker_group)
                break
            except Exception as err:
                # The store went away while this node joined or waited as a spare: wait for it to come back
                # (its state restored) and join again, rather than exit and have the pod replaced.
                if not (self._keeper.usable and storekeeper.is_store_loss(err)):
                    raise
                self._keeper.lost(err)
                if deadline is None:
                    deadline = time.monotonic() + join_timeout(worker_group.spec.rdzv_handler)
                if not self._keeper.wait(deadline):
                    raise
        # The workers started next inherit the agent's environment (torchelastic copies os.environ), so rank 0
        # can report when its group formed: the recovery clock's "rendezvous" phase.
        os.environ[contract.DDPJOB_RENDEZVOUS_TIME] = f"{time.time():.3f}"
        # A restart request already in the file is older than this group: not one to answer (restart_request).
        self._known_request = restart_request.seen(self._request_file, self._known_request)
        log.info("rendezvous complete: this pod is in the group (world of %d agents)",
                 worker_group.group_world_size or 0)
        if replication.ACTIVE is not None:
            # Before any trainer starts: every pod of the group holds the same newest complete checkpoints.
            replication.ACTIVE.sync(worker_group)
        self._watch_membership(worker_group)

    def _watch_membership(self, group: WorkerGroup | None, final: bool = False) -> None:
        """Watch the round just completed (ddpjob_worker.membership); None: stop watching (``final``: the agent
        ends)."""
        if self._membership is not None:
            self._membership.stop(final)
            self._membership = None
        if group is not None and group.group_rank is not None and group.group_world_size:
            self._membership = Membership.start(group.spec.rdzv_handler, group.group_rank, group.group_world_size)

    def _exit_barrier(self) -> None:
        if self._keeper.lost_since is not None:
            # Its store client points at the lost store: every call would fail or, to a lost node, hang.
            log.warning("the job is done but the rendezvous store is still unreachable: not waiting for the other "
                        "agents at the exit barrier")
            return
        super()._exit_barrier()  # type: ignore[no-untyped-call]

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        # Runs every monitor interval on the main thread, the one a waiting trainer's life is tied to.
        warm.POOL.refill()
        requested = self._restart_requested() or self._membership_lost()
        if requested is not None:
            return requested
        result: RunResult = super()._monitor_workers(worker_group)
        if result.state in {WorkerState.FAILED, WorkerState.UNHEALTHY} and peer_loss(result.failures):
            rank, failure = min(result.failures.items(), key=lambda item: item[1].timestamp)
            # _invoke_run takes one restart right after this returns; giving it back first means a survivor
            # re-rendezvouses with the replaced peer as often as peers die, while its own crashes stay bounded.
            if compat.refund_restart(self):
                log.warning("worker group failed because a peer was lost (rank %s: %s); restarting it without "
                            "using one of the %d restarts", rank, causes.condense(failure_text(failure), 200),
                            worker_group.spec.max_restarts)
            else:
                log.warning("worker group failed because a peer was lost (rank %s); this torch counts the restart "
                            "(update ddpjob_worker.compat)", rank)
        return result

    def _membership_lost(self) -> RunResult | None:
        """UNHEALTHY when the round lost a member (ddpjob_worker.membership): the trainers are killed, not asked
        (a trainer waiting in a collective with a dead peer runs no signal handler until the collective's timeout,
        and its SIGTERM checkpoint would need that peer too); the group resumes from the last committed
        checkpoint. The restart is given back: the loss is not this pod's failure."""
        if self._membership is None or self._keeper.lost_since is not None:
            return None
        why = self._membership.lost()
        if why is None:
            return None
        self._watch_membership(None)
        compat.close_workers(self, signal.SIGKILL, 1)
        refunded = compat.refund_restart(self)
        log.warning("%s: killing the trainers and re-forming the group without using a restart%s", why,
                    "" if refunded else " (this torch counts the restart: update ddpjob_worker.compat)")
        return RunResult(state=WorkerState.UNHEALTHY)

    def _restart_requested(self) -> RunResult | None:
        """An UNHEALTHY result when the operator asked this group to restart in place (a stall: pod annotation
        ddpjob_worker.restart_request, read at most once a second); _invoke_run then stops the trainers (SIGTERM,
        so they can checkpoint) and re-forms the group, keeping the pod and its checkpoints. The restart is given
        back first: a stall is not this pod's failure, and an agent out of restarts must still obey."""
        now = time.monotonic()
        if not self._request_file or now < self._next_request_check:
            return None  # no file: not a pod of the operator's (ddpjob run)
        self._next_request_check = now + 1.0
        request = restart_request.due(self._request_file, self._known_request)
        if request is None:
            return None
        self._known_request = request.incident  # one answer per request
        refunded = compat.refund_restart(self)
        log.warning("the operator asked this group to restart in place (incident #%d, a stall): stopping the "
                    "trainers and re-forming the group, keeping this pod and its checkpoints%s", request.incident,
                    "" if refunded else " (this torch counts the restart: update ddpjob_worker.compat)")
        return RunResult(state=WorkerState.UNHEALTHY)

    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, *args: Any, **kwargs: Any) -> None:
        # torch before 2.15 closes the workers 30 s after forwarding the agent's SIGTERM, whatever the budget: a
        # final checkpoint longer than that was cut. Close them with the budget first; torch's own close then
        # finds them gone. (Its signature differs between releases: is_restart in 2.6, timeout in 2.15.)
        if _shutdown_seconds is not None and not compat.capabilities().shutdown_timeout and compat.signalled():
            log.info("stopping the workers: %s, then SIGKILL after %d s", death_sig.name, _shutdown_seconds)
            compat.close_workers(self, death_sig, _shutdown_seconds)
        super()._shutdown(death_sig, *args, **kwargs)


#: Store reads per second, all agents together, that the rendezvous poll is scaled to (see poll_seconds).
POLLS_PER_SECOND = 100


def poll_seconds(max_nodes: int) -> float:
    """Seconds between two reads of the rendezvous state by an agent (torch: 1 s, and a 1 s cache of the state).

    Every restart waits for that poll twice (the first agent back waits in the wait list for the last one to
    end the old round, then for the new round to complete): about a second of each recovery on a small job. The
    read is of the whole state, which grows with the nodes, so the interval grows with them: 0.1 s up to 10
    nodes, torch's 1 s from 100."""
    return min(1.0, max(0.1, max_nodes / POLLS_PER_SECOND))


def tune_polls(handler: Any) -> float | None:
    """Make a DynamicRendezvousHandler poll every poll_seconds (its wait between polls and its state cache);
    returns the interval, or None for a handler without them (left as it is)."""
    settings = compat.rendezvous_settings(handler)
    poll = poll_seconds(int(getattr(settings, "max_nodes", 100)))
    return poll if compat.set_poll_interval(handler, poll) else None


#: Seconds between SIGTERM and SIGKILL for the workers when the agent got a signal (launch's shutdown_timeout);
#: PodAgent applies it itself where torchrun cannot (compat.Capabilities.shutdown_timeout).
_shutdown_seconds: int | None = None


def install(shutdown_seconds: int | None = None) -> None:
    """Make torchrun's launch_agent build a PodAgent whose workers get ``shutdown_seconds`` after a SIGTERM, and
    start workers from pre-started trainers; logs this torch's capabilities once."""
    global _shutdown_seconds
    if shutdown_seconds is not None:
        _shutdown_seconds = shutdown_seconds
    compat.log_capabilities()
    if not compat.install_agent_class(PodAgent):  # a torch upgrade moved it: plain torchrun behaviour, said loudly
        log.error("torch.distributed.launcher.api does not build LocalElasticAgent; failed agents will close the "
                  "rendezvous and peer losses will use up restarts (update ddpjob_worker.compat)")
        return
    warm.install()

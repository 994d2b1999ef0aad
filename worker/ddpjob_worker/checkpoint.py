"""Checkpoints for exact resume of DDP training: atomic, checksummed, rotated, preemption-aware.

Use it from every rank::

    ckpt = Checkpointer(CheckpointConfig.from_env(every_steps=100), model=ddp_model, optimizer=opt,
                        lr_scheduler=sched)
    state = ckpt.resume()                      # latest valid checkpoint, or a fresh TrainState
    for epoch in range(state.epoch, epochs):
        sampler.set_epoch(epoch, consumed=state.samples_in_epoch)  # ElasticDistributedSampler: mid-epoch start
        for i, batch in enumerate(loader, start=1):
            ...; optimizer.step(); state.step_in_epoch += 1; state.global_step += 1
            state.samples_in_epoch = sampler.position(i * batch_size)
            ckpt.after_step(state)             # saves every N steps; on SIGTERM saves and exits 143
        state.next_epoch()                     # so a resume never repeats a finished epoch
    ckpt.close()

See docs/checkpoints.md for the on-disk format and the guarantees.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from ddpjob_worker import contract, fencing, replicas
from ddpjob_worker.logs import get_logger
from ddpjob_worker.payload import FORMAT_VERSION as FORMAT_VERSION  # re-exported: part of this API
from ddpjob_worker.payload import TrainingObjects, build_payload
from ddpjob_worker.payload import TrainState as TrainState  # re-exported: defined with the rest of the payload
from ddpjob_worker.preemption import EXIT_AFTER_SIGTERM as EXIT_AFTER_SIGTERM  # re-exported: part of this API
from ddpjob_worker.preemption import Preemption
from ddpjob_worker.rngstate import capture_rng as capture_rng  # re-exported: part of this API
from ddpjob_worker.rngstate import derive_rng, restore_rng
from ddpjob_worker.staging import BackgroundWriter, SaveFailures
from ddpjob_worker.staging import CheckpointSaveFailed as CheckpointSaveFailed  # raised by save, wait and close
from ddpjob_worker.storage import LocalStorage
from ddpjob_worker.storage_api import CorruptCheckpoint as CorruptCheckpoint  # read raises it; part of this API
from ddpjob_worker.storage_api import Fence
from ddpjob_worker.storage_api import Storage as Storage  # what Checkpointer(storage=...) takes; part of this API

log = get_logger("checkpoint")

__all__ = ["EXIT_AFTER_SIGTERM", "FORMAT_VERSION", "CheckpointConfig", "CheckpointSaveFailed", "Checkpointer",
           "CorruptCheckpoint", "Storage", "TrainState", "capture_rng"]


@dataclasses.dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    """How and where checkpoints are written."""

    directory: str
    """Folder of ``step-N`` checkpoints: the job's checkpoint volume, shared by all ranks or one per pod."""
    keep: int = contract.DEFAULT_CHECKPOINT_KEEP
    """How many valid checkpoints to keep; older ones are deleted after each save, so a corrupt newest one
    still leaves ``keep - 1`` to fall back to."""
    every_steps: int = 0
    """``after_step`` saves when ``global_step`` is a multiple of this; 0 saves only when asked or preempted."""
    async_save: bool = False
    """Writers copy the state into host buffers kept between saves (one state's size per writer rank, see
    staging) and write it in a thread, so training does not wait for the disk; the next save, ``wait`` or ``close``
    waits for it, and raises on every rank if it failed."""
    sigterm_budget_seconds: float = float(contract.DEFAULT_SIGTERM_BUDGET_SECONDS)
    """After SIGTERM: seconds to finish the step and write the last checkpoint before exiting anyway."""
    handle_sigterm: bool = True
    """Install the SIGTERM handler (finish the step, checkpoint, exit 143)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> CheckpointConfig:
        """Directory, keep and budget from the worker contract (``./checkpoints`` outside a DDPJob).

        Args:
            environ: The environment to read; None: this process's.
            **overrides: Fields to set instead (``every_steps=100``, ``async_save=True``).

        Returns:
            The configuration.
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {
            "directory": env.get(contract.DDPJOB_CHECKPOINT_DIR) or "checkpoints",
            "keep": int(env.get(contract.DDPJOB_CHECKPOINT_KEEP) or contract.DEFAULT_CHECKPOINT_KEEP),
            "sigterm_budget_seconds": float(
                env.get(contract.DDPJOB_SIGTERM_BUDGET_SECONDS) or contract.DEFAULT_SIGTERM_BUDGET_SECONDS
            ),
        }
        values.update(overrides)
        return cls(**values)


class Checkpointer:
    """Saves and restores everything exact resume needs; every method is called on every rank.

    Constructing one is collective too: the ranks learn which of them shares which volume (see replicas).

    Args:
        config: How and where checkpoints are written.
        model: The model (DDP-wrapped or not: the module inside DDP is saved, so a plain model loads it too).
        optimizer: Saved and restored with the model, if given.
        lr_scheduler: Anything with ``state_dict``/``load_state_dict``, saved and restored with the model.
        grad_scaler: The AMP ``GradScaler``, if any, saved and restored with the model.
        storage: Where checkpoints live; None: ``LocalStorage`` on ``config.directory``.
    """

    def __init__(
        self,
        config: CheckpointConfig,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        lr_scheduler: Any | None = None,
        grad_scaler: Any | None = None,
        storage: Storage | None = None,
    ) -> None:
        self.config = config
        self.storage: Storage = storage if storage is not None else LocalStorage(Path(config.directory))
        self._saved = TrainingObjects(model, optimizer, lr_scheduler, grad_scaler)
        self._distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self._distributed else 0
        self.world_size = dist.get_world_size() if self._distributed else 1
        param = next(iter(model.parameters()), None)
        #: Every rank maps tensors onto its own device (cuda:LOCAL_RANK or cpu), never onto rank 0's.
        self.device = param.device if param is not None else torch.device("cpu")
        #: The group of the object collectives below (collective: every rank constructs its Checkpointer together):
        #: the default one under gloo, a gloo side group under NCCL (issue 23 #13).
        self._objects = replicas.object_group()
        #: Which rank writes each volume's copy.
        self.layout = replicas.discover(self.storage.volume_id(), self._objects)
        #: Whether this rank writes checkpoints (the lowest rank on its volume) and verifies them at resume.
        self.is_writer = self.layout.writer(self.rank) == self.rank
        if self.rank == 0:
            log.log(*self.layout.describe())
        #: This start of the process group (see fencing): set by ``resume``, or by a ``save`` before any resume.
        self.incarnation: int | None = None
        #: A writer's asynchronous saves (host staging buffers and the thread); made by the first one.
        self._background: BackgroundWriter | None = None
        #: On every rank: an asynchronous save was started and its outcome not yet agreed on (see ``wait``).
        self._async_pending = False
        self._failures = SaveFailures(self.rank, self.device, self._objects)
        self._preemption = Preemption(self.rank, lambda: self.config.sigterm_budget_seconds, self.device,
                                      self._distributed)
        self.last_saved_step: int | None = None
        self.last_saved_time: float | None = None
        #: Seconds the last write (on this rank, its writer) and the last resume's load took: progress reports.
        self.last_save_seconds: float | None = None
        self.last_load_seconds: float | None = None
        if config.handle_sigterm:
            self._preemption.install()

    # --- preemption ---

    def preempted(self) -> bool:
        """Whether any rank got SIGTERM (a pod's SIGTERM reaches only its own workers); collective.

        Returns:
            The same answer on every rank: True once any of them got SIGTERM.
        """
        return self._preemption.anywhere()

    def exit_preempted(self, state: TrainState) -> NoReturn:
        """Write the final checkpoint (blocking) and exit 143 on every rank.

        Args:
            state: Where training is: what the final checkpoint records.

        Raises:
            CheckpointSaveFailed: The final save failed on some writer (then nothing exits here).
        """
        self.save(state, blocking=True)
        since = self._preemption.since
        spent = time.monotonic() - since if since is not None else 0.0
        log.warning("preempted: checkpoint step-%d written %.1fs after SIGTERM; exiting %d",
                    state.global_step, spent, EXIT_AFTER_SIGTERM)
        sys.stderr.flush()
        os._exit(EXIT_AFTER_SIGTERM)  # not sys.exit: no atexit/destructor may hang past the budget

    def after_step(self, state: TrainState) -> None:
        """Call after every optimizer step: exits after a final save when preempted, saves every N steps.

        Args:
            state: Where training is, after this step.

        Raises:
            CheckpointSaveFailed: A save (this one or an earlier asynchronous one) failed on some writer.
        """
        if self.config.handle_sigterm and self.preempted():
            self.exit_preempted(state)
        if self.config.every_steps and state.global_step % self.config.every_steps == 0:
            self.save(state)

    # --- save ---

    def _state_dict(self, state: TrainState, rng: list[Any]) -> dict[str, Any]:
        return build_payload(state, self.world_size, rng, self._saved)

    def save(self, state: TrainState, *, blocking: bool | None = None) -> None:
        """Checkpoint ``state`` as ``step-<global_step>``; collective. One rank per volume writes (rank 0 alone on a
        shared volume); when this returns (sync mode) every copy is committed and every rank passed the barrier.
        A save that failed on any writer raises CheckpointSaveFailed on every rank: here in sync mode, at the next
        ``save``/``wait``/``close`` for an asynchronous one.

        Args:
            state: Where training is: saved with the model and friends, and returned by the next ``resume``.
            blocking: Wait until the checkpoint is committed; None: unless ``config.async_save``.

        Raises:
            CheckpointSaveFailed: This save (sync mode) or the previous asynchronous one failed on some writer.
        """
        self.wait()
        if self.incarnation is None:  # no resume(): this run starts a history of its own, from scratch
            view = fencing.gather(self._own_volume(), self._objects)
            self.incarnation = fencing.begin(self._own_volume(), view, None)
        rng = capture_rng(self.device)
        rngs: list[Any] = [None] * self.world_size
        if self._distributed:
            dist.all_gather_object(rngs, rng, group=self._objects)
        else:
            rngs = [rng]
        is_async = self.config.async_save if blocking is None else not blocking
        # DDP keeps parameters and optimizer state identical on every rank and the RNG states were just gathered,
        # so every writer's payload is the same checkpoint.
        if self.is_writer:
            write = functools.partial(self._write, state.global_step, self.incarnation)
            failed = functools.partial(self._failures.record, state.global_step)
            try:
                payload = self._state_dict(state, rngs)
                if is_async:
                    self._background = self._background or BackgroundWriter()
                    self._background.start(payload, write, failed)  # returns once the host copy is taken
                else:
                    write(payload)
            except Exception as err:  # every rank must still reach the collective below (or the next wait's)
                failed(err)
        if is_async:
            self._async_pending = True
        else:
            self._failures.raise_everywhere()  # doubles as the barrier: every copy is committed when it returns

    def _write(self, step: int, incarnation: int, payload: dict[str, Any]) -> None:
        started = time.monotonic()
        meta = {"world_size": self.world_size, fencing.INCARNATION: incarnation}
        manifest = self.storage.write(step, payload, meta, before_commit=functools.partial(
            fencing.ensure_current, self.storage, incarnation))
        seconds = time.monotonic() - started
        self.last_saved_step, self.last_saved_time, self.last_save_seconds = step, time.time(), seconds
        removed = self._purge(protect=step)
        log.info("checkpoint step-%d saved: %.1f MB in %.2fs (%.0f MB/s), sha256 %s...%s", step,
                 manifest.size / 1e6, seconds, manifest.size / 1e6 / max(seconds, 1e-9), manifest.sha256[:12],
                 f"; removed step {removed}" if removed else "")

    def _purge(self, protect: int | None) -> list[int]:
        """Rotation by this volume's records, so that a stale checkpoint never counts as one of the ``keep``."""
        fences = self.storage.fences()
        return self.storage.purge(self.config.keep, protect=protect,
                                  valid=lambda step: fencing.stale_reason(self.storage, step, fences) is None)

    def _own_volume(self) -> Storage | None:
        """The storage this rank writes, if it is its volume's writer."""
        return self.storage if self.is_writer else None

    def wait(self) -> None:
        """Block until an asynchronous save has been committed; collective.

        Raises:
            CheckpointSaveFailed: On every rank, the same, if the save failed on any writer (naming the writer and
                the cause).
        """
        if not self._async_pending:  # the same on every rank: all of them started the save or none did
            return
        if self._background is not None:
            self._background.join()
        self._async_pending = False
        self._failures.raise_everywhere()

    # --- resume ---

    def load_latest_valid(self, fences: Collection[Fence] = ()) -> tuple[int, dict[str, Any]] | None:
        """Newest checkpoint on this rank's volume whose checksum verifies and that none of ``fences`` makes
        stale, loaded; bad ones are logged, set aside and skipped. Not collective (``resume`` calls it on writers).

        Args:
            fences: The job's fence records (``fencing.gather``); empty: no checkpoint is stale.

        Returns:
            The step and its state, or None if the volume holds no valid checkpoint.
        """
        self._set_aside_stale(fences)
        for step in self.storage.committed_steps():
            if fencing.stale_reason(self.storage, step, fences):
                continue  # committed since the sweep above; the next resume sets it aside
            try:
                return step, self.storage.read(step, self.device, verify=True)
            except CorruptCheckpoint as err:
                log.error("checkpoint step-%d in %s is corrupt (%s); falling back to the previous valid "
                          "checkpoint", step, self.config.directory, err)
                self.storage.quarantine(step, str(err))
        return None

    def _set_aside_stale(self, fences: Collection[Fence]) -> None:
        """Move every stale checkpoint aside, older ones too: rotation never counts or deletes them."""
        for step in self.storage.committed_steps():
            if reason := fencing.stale_reason(self.storage, step, fences):
                log.warning("checkpoint step-%d in %s is stale (%s: a writer cut off from the job, such as a "
                            "partitioned pod); set aside, never resumed from", step, self.config.directory, reason)
                self.storage.quarantine(step, f"stale: {reason}", label="stale")

    def resume(self) -> TrainState:
        """Restore the newest valid checkpoint any volume holds into the model and friends (a fresh TrainState
        if none); ranks whose volume lacks it receive it from a peer, and their writer stores a copy.

        Returns:
            Where training is in the restored checkpoint, the same on every rank; a fresh TrainState if there was
            none.
        """
        started = time.monotonic()
        # A record on any volume fences checkpoints on all of them.
        view = fencing.gather(self._own_volume(), self._objects)
        local = self.load_latest_valid(view.fences) if self.is_writer else None
        if self.is_writer:
            # No save of this process group can be running now (torchrun stops a group before starting the next),
            # so temporary folders are the remains of a crashed save.
            self._purge(protect=local[0] if local is not None else None)
        # Everyone loads the same step (no rank can race ahead): the newest that any volume still holds.
        plan = replicas.agree(local[0] if local is not None else None, self.layout, self._objects)
        # Recorded before anyone trains: from here on, what an earlier incarnation commits past plan.step is stale.
        self.incarnation = fencing.begin(self._own_volume(), view, plan.step)
        if plan.step is None:
            log.info("no valid checkpoint in %s; starting from scratch (incarnation %d)", self.config.directory,
                     self.incarnation)
            return TrainState()
        data, origin = self._obtain(plan, local)
        self._restore(plan.step, data)
        self.last_load_seconds = time.monotonic() - started
        state = TrainState(**data["train"])
        # "(origin)" right after the step: tests and users grep for "(local copy)" / "(received from rank N)".
        log.info("resumed from checkpoint step-%d (%s): epoch %d, step %d of the epoch; incarnation %d", plan.step,
                 origin, state.epoch, state.step_in_epoch, self.incarnation)
        if self._distributed:
            dist.barrier()
        return state

    def _obtain(self, plan: replicas.ResumePlan, local: tuple[int, dict[str, Any]] | None
                ) -> tuple[dict[str, Any], str]:
        """The state of ``plan.step`` for this rank, and where it came from (for the log)."""
        assert plan.step is not None
        data: dict[str, Any] | None = None
        if self.rank in plan.holders:
            data = local[1] if local is not None else self.storage.read(plan.step, self.device, verify=False)
        origin = "local copy"
        if plan.receivers:
            received = replicas.transfer(plan, data)
            if self.rank in plan.receivers:
                assert received is not None
                data, origin = received, f"received from rank {plan.source}"
        assert data is not None
        # A replaced pod's volume lacks the step, and a holder's copy may have been rotated away meanwhile by a
        # stale writer that counted its own late checkpoint: the volume holds it again and can serve it next time.
        if self.is_writer and plan.step not in self.storage.committed_steps():
            meta = {"world_size": data["world_size"], fencing.INCARNATION: self.incarnation}
            self.storage.write(plan.step, data, meta)
            self._purge(protect=plan.step)
        return data, origin

    def _restore(self, step: int, data: dict[str, Any]) -> None:
        self._saved.load(data)
        rngs = data["rng"]
        if len(rngs) == self.world_size:
            restore_rng(rngs[self.rank], self.device)
            return
        seed = derive_rng(rngs, self.rank, self.world_size)
        log.info("checkpoint step-%d was written by %d ranks, now %d: rank %d's RNGs seeded with %d, derived from "
                 "the checkpoint's states (docs/checkpoints.md)", step, len(rngs), self.world_size, self.rank, seed)

    def close(self) -> None:
        """Wait for a pending save (collective), free the staging buffers and give SIGTERM back to its previous
        handler.

        Raises:
            CheckpointSaveFailed: The pending asynchronous save failed on some writer.
        """
        try:
            self.wait()
        finally:
            self._background = None  # frees the staging buffers
            self._preemption.uninstall()

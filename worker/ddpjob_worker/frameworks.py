"""What the runtime must know of the training frameworks users bring, where one of them ends a rank in a way
torchrun would misread. Imported by the trainer wrapper (ddpjob_worker.recorded); nothing here imports a framework:
each is recognised by the names of what it raises.

Lightning (>= 2.5) stops every rank when one rank receives SIGTERM: the signalled rank's handler broadcasts a flag,
each other rank reads it in its next step's broadcast and raises ``SIGTERMException``, a ``SystemExit`` without a
code, so that rank's process exits 0 (lightning/pytorch/loops/training_epoch_loop.py, _broadcast_sigterm_tensor).
When a pod is deleted, its trainer gets SIGTERM and the trainers of the other pods then exit 0 mid-run: torchrun
reads that as their group having finished, their agents wait at the exit barrier instead of re-forming the group,
and the job cannot recover (seen 2026-12-06: two agents, a pod of the pair stopped, the other agent waited 300 s at
the exit barrier and left with 0). Such an exit is a peer's loss, not this rank's success.
"""

from __future__ import annotations

import traceback

#: The exception class that stops a Lightning rank after a SIGTERM (its own or, by broadcast, a peer's).
LIGHTNING_SIGTERM = "SIGTERMException"


class PeerStopped(RuntimeError):
    """This rank was stopped by its framework because a peer rank was stopped: the group lost a member.
    ddpjob_worker.causes counts it as a peer loss, so the agent re-forms the group without using a restart."""


def peer_stopped(stop: BaseException) -> str | None:
    """Why ``stop`` (what ended the script) is a peer's loss rather than this rank's end, or None when it is not
    one (any other exit, or this process received the SIGTERM itself: its pod is being stopped)."""
    if not isinstance(stop, SystemExit) or type(stop).__name__ != LIGHTNING_SIGTERM or stop.code not in (None, 0):
        return None
    trainer = _lightning_trainer(stop)
    if trainer is None or bool(getattr(trainer, "received_sigterm", True)):
        return None
    return ("Lightning stopped this rank because another rank received SIGTERM (SIGTERMException by broadcast): "
            "a peer of the group was stopped, so the group re-forms and resumes from the last checkpoint")


def _lightning_trainer(stop: BaseException) -> object | None:
    """The Trainer whose loop raised ``stop``: Lightning's entry point (trainer/call.py,
    _call_and_handle_interrupt) holds it as its local ``trainer`` and re-raises the exception through that frame.
    Its ``received_sigterm`` is set by Lightning's own handler in the process the signal reached."""
    for frame, _ in traceback.walk_tb(stop.__traceback__):
        trainer: object | None = frame.f_locals.get("trainer")
        if trainer is not None and hasattr(trainer, "received_sigterm"):
            return trainer
    return None

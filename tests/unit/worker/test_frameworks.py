"""ddpjob_worker.frameworks: a Lightning rank stopped by a peer's SIGTERM (its SIGTERMException, a SystemExit with
no code, raised while its own Trainer received no SIGTERM) is a peer's loss, and every other exit is left alone.
The Lightning names are reproduced here (the unit tier has no Lightning): the class name and the ``trainer``
local of Lightning's entry point (trainer/call.py) that the module reads."""

from __future__ import annotations

import pytest
from ddpjob_worker import causes, frameworks


class SIGTERMException(SystemExit):  # lightning.pytorch.utilities.exceptions.SIGTERMException
    pass


class Trainer:
    def __init__(self, received_sigterm: bool) -> None:
        self.received_sigterm = received_sigterm


def _call_and_handle_interrupt(trainer: Trainer | None, stop: BaseException) -> None:
    """Lightning's entry point: holds the trainer as a local while the loop's exception passes through."""
    try:
        raise stop
    except BaseException:
        raise


def stopped(stop: BaseException, trainer: Trainer | None) -> BaseException:
    try:
        _call_and_handle_interrupt(trainer, stop)
    except BaseException as err:  # the test inspects whatever came out
        return err
    raise AssertionError("nothing raised")


@pytest.mark.parametrize(("stop", "trainer", "peer"), [
    (SIGTERMException(), Trainer(received_sigterm=False), True),  # the broadcast from a stopped peer
    (SIGTERMException(0), Trainer(received_sigterm=False), True),
    (SIGTERMException(), Trainer(received_sigterm=True), False),  # this pod is being stopped: its exit stands
    (SIGTERMException(1), Trainer(received_sigterm=False), False),  # an exit with a code: the script's own
    (SIGTERMException(), None, False),  # no Trainer to ask: keep what the framework chose
    (SystemExit(), Trainer(received_sigterm=False), False),  # a plain sys.exit() of the script
    (KeyboardInterrupt(), Trainer(received_sigterm=False), False),
])
def test_only_a_peers_sigterm_broadcast_is_a_peer_loss(stop: BaseException, trainer: Trainer | None,
                                                       peer: bool) -> None:
    why = frameworks.peer_stopped(stopped(stop, trainer))
    assert (why is not None) == peer, why


def test_the_failure_it_becomes_is_read_as_a_peer_loss() -> None:
    why = frameworks.peer_stopped(stopped(SIGTERMException(), Trainer(received_sigterm=False)))
    assert why is not None
    name = f"{frameworks.PeerStopped.__module__}.PeerStopped"
    text = f"Traceback (most recent call last):\n  File \"x.py\", line 1\n{name}: {why}"
    assert causes.is_peer_loss(text)
    assert not causes.is_peer_loss("ValueError: Can't find a valid checkpoint (rank 1)")

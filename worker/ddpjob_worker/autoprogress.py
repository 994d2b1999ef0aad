"""Progress without code changes: in the rank-0 trainer, the recorded runner counts the script's optimizer steps and
reports them to the DDPJob's ``status.progress`` (steps, step rate, time of the last step) through the progress
reporter's own path, so a plain script (the PyTorch DDP tutorial's, say) shows its progress and is never taken for
stalled while it trains, nor after it returned, while the workers exit (``progress.finishTime``).

What counts as a step: one ``step()`` of any ``torch.optim.Optimizer``, its subclasses included (Apex, DeepSpeed's
and bitsandbytes' optimizers, and what Lightning, Accelerate and the Hugging Face Trainer step), through torch's
global optimizer hook. After a resume the count goes on from the script's own step: at the first step the counter
reads the step count the optimizer's state carries (Adam, AdamW, Adagrad, RMSprop and most others keep
``state[param]["step"]``, restored with the checkpoint); an optimizer without one (SGD) counts from 0 in each
process. A script that updates its parameters without an optimizer is not seen: it reports with
ProgressReporter (docs/api.md, "Stall detection"). Once the script creates a ``ProgressReporter`` itself, its report
owns the status and the counter sends nothing, so nothing is counted twice.

The hook only counts; a daemon thread sends, so training never waits for the API server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ddpjob_worker import progress
from ddpjob_worker.logs import get_logger

log = get_logger("autoprogress")

#: Seconds between two reports while steps go on (the script's reporter uses the same interval).
INTERVAL_SECONDS = 10.0
#: After the first step, how long the counter waits before its first report: a script with its own reporter
#: reports right after its first step, and then the counter never sends at all.
FIRST_REPORT_GRACE_SECONDS = 0.5
#: How long a returned script's last reports may hold its exit: the job ends after it, so nothing waits on these
#: seconds, and a finish that never arrives leaves the stall clock running against the workers' exit.
FINISH_WAIT_SECONDS = 5.0


class StepCounter:
    """Optimizer steps seen in this process: how many, the first and the last one's time. Called by torch's
    global optimizer hook: it only counts (a few attribute writes per step)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.steps = 0
        self.first: float | None = None
        self.last: float | None = None
        self.stepped = threading.Event()
        self._clock = clock
        # id(optimizer) -> id(optimizer.state) when last read. load_state_dict replaces the state object, so a
        # changed id means a load since: torch.distributed.checkpoint's get_state_dict initialises an empty
        # optimizer with a step of its own (lr 0, zero grads) *before* the script loads its checkpoint into it,
        # and a count read only at the first step stayed at 1 after every DCP resume. Ids, not references: a
        # reference would keep a replaced state (GBs of moments) alive.
        self._states: dict[int, int] = {}

    def __call__(self, optimizer: Any = None, *_hook_args: Any) -> None:
        now = self._clock()
        if optimizer is not None:
            state_id = id(getattr(optimizer, "state", None))
            seen = self._states.get(id(optimizer))
            if self.first is None or (seen is not None and seen != state_id):
                self.steps = resumed_step(optimizer)
            self._states[id(optimizer)] = state_id
        self.steps += 1
        self.last = now
        if self.first is None:
            self.first = now
            self.stepped.set()

    def reading(self) -> tuple[int, float, float] | None:
        """(steps, first step's time, last step's time), or None before the first step."""
        steps, first, last = self.steps, self.first, self.last
        return None if first is None or last is None else (steps, first, last)


def resumed_step(optimizer: Any) -> int:
    """The steps ``optimizer`` had taken before this process, read right after its first step here: the highest
    ``state[param]["step"]`` less the step just taken; 0 for a fresh run or an optimizer that keeps no count."""
    highest = 0.0
    try:
        for state in getattr(optimizer, "state", {}).values():
            step = state.get("step") if isinstance(state, dict) else None
            if step is not None:
                highest = max(highest, float(step))
    except (TypeError, ValueError, RuntimeError):
        return 0  # a state this reading does not understand: count from this process's start, as before
    return max(0, int(highest) - 1)


class AutoReporter:
    """Sends the counter's steps every ``interval`` while they change, from a daemon thread, until the script
    reports itself; once more when the script returned (its final step)."""

    def __init__(self, counter: StepCounter, reporter: progress.ProgressReporter, *,
                 interval: float = INTERVAL_SECONDS, grace: float = FIRST_REPORT_GRACE_SECONDS) -> None:
        self.counter = counter
        self.reporter = reporter
        self.interval = interval
        self.grace = grace
        self.stop = threading.Event()
        self.hook: Any = None
        """torch's handle of the optimizer hook (install sets it; close removes it)."""
        self._sent: int | None = None
        self._lock = threading.Lock()

    def send(self) -> None:
        """Report the steps counted so far, unless nothing changed or the script reports itself."""
        with self._lock:  # the thread and the exit handler
            reading = self.counter.reading()
            if reading is None or reading[0] == self._sent or progress.script_reports():
                return
            steps, first, last = reading
            self.reporter.report_steps(steps, last, first)
            self._sent = steps

    def run(self) -> None:
        """The thread: the new group's start at once, then the steps."""
        self.reporter.announce_start()
        while not self.counter.stepped.wait(1.0):
            if self.stop.is_set():
                return
        if self.stop.wait(self.grace):
            return
        while not progress.script_reports():
            self.send()
            if self.stop.wait(self.reporter.interval_now(self.interval)):  # or the operator's cadence
                return

    def close(self) -> None:
        """The script returned: stop the thread, send the last count (its final step) and that the script is done
        (the operator's stall clocks then wait for the workers' exit, not for a step), and give both a few seconds
        to go out. Not called when the script failed: the failed trainer leaves at once (recorded.leave), the
        restart is what matters then."""
        self.stop.set()
        if self.hook is not None:
            self.hook.remove()
        self.send()
        self.reporter.announce_finish()
        self.reporter.drain(FINISH_WAIT_SECONDS)


class RuntimeReporter(progress.ProgressReporter):
    """The counter's own reporter: the same path to status.progress, without claiming it from the script."""

    owns_progress = False


def install(environ: Mapping[str, str] | None = None) -> AutoReporter | None:
    """In the trainer, before the script runs: count optimizer steps and report them, on rank 0 of a DDPJob (or
    of ``ddpjob run``); None elsewhere, where nothing is installed and nothing costs anything."""
    reporter = RuntimeReporter(environ=environ)
    if not reporter.active:
        return None
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    counter = StepCounter()

    def hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        counter(optimizer)

    # Eager even where the optimizer step is compiled: a hook traced by dynamo would read the clock once.
    auto = AutoReporter(counter, reporter)
    auto.hook = register_optimizer_step_post_hook(torch.compiler.disable(hook))  # type: ignore[no-untyped-call]
    threading.Thread(target=auto.run, name="ddpjob-progress", daemon=True).start()
    return auto

"""Progress without code changes (ddpjob_worker.autoprogress): the step counter, its reporter thread, the hand-over
to a script's own ProgressReporter, and what goes into status.progress."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from ddpjob_worker import autoprogress, contract, progress, sender
from ddpjob_worker.progress import ProgressReporter

ENV = {contract.DDPJOB_NAME: "tutorial", contract.DDPJOB_NAMESPACE: "ml", contract.DDPJOB_REPORT_PROGRESS: "1",
       "RANK": "0", "TORCHELASTIC_RESTART_COUNT": "2", contract.DDPJOB_RENDEZVOUS_TIME: "1000.250"}


class FakeApi:
    """Records status patches (what the API server would merge into status.progress)."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.kwargs: list[dict[str, Any]] = []
        self.sent = threading.Event()

    def patch_namespaced_custom_object_status(self, *args: Any, **kwargs: Any) -> None:
        self.bodies.append(args[-1]["status"]["progress"])
        self.kwargs.append(kwargs)
        self.sent.set()


@pytest.fixture(autouse=True)
def no_script_report() -> Iterator[None]:
    """The module flag is per process: every test starts as a script that never called report()."""
    progress._script_reports.clear()
    yield
    progress._script_reports.clear()


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_the_counter_counts_steps_with_their_first_and_last_time() -> None:
    clock = Clock()
    counter = autoprogress.StepCounter(clock)
    assert counter.reading() is None and not counter.stepped.is_set()
    for t in (1001.0, 1002.0, 1003.5):
        clock.t = t
        counter(object(), (), {})
    assert counter.reading() == (3, 1001.0, 1003.5) and counter.stepped.is_set()


def test_steps_are_reported_with_the_rate_the_time_of_the_last_step_and_the_source() -> None:
    api, clock = FakeApi(), Clock()
    counter = autoprogress.StepCounter(clock)
    auto = autoprogress.AutoReporter(counter, autoprogress.RuntimeReporter(environ=ENV, api=api))
    for t in (1001.0, 1002.0):
        clock.t = t
        counter()
    auto.send()
    auto.send()  # nothing new: nothing sent
    assert auto.reporter.drain(5)
    for t in (1003.0, 1004.0, 1006.0):
        clock.t = t
        counter()
    auto.send()
    assert auto.reporter.drain(5)
    first, second = api.bodies
    assert first["globalStep"] == 2 and first["source"] == "OptimizerSteps" and "stepRate" not in first
    assert first["lastStepTime"] == "1970-01-01T00:16:42.000Z"
    assert first["start"] == {"restartCount": 2, "rendezvousTime": "1970-01-01T00:16:40.250Z",
                              "firstStepTime": "1970-01-01T00:16:41.000Z"}
    assert "epoch" not in first and "loss" not in first  # only what the runtime knows
    assert second["globalStep"] == 5 and second["stepRate"] == 0.75  # 3 steps from 1002.0 to 1006.0
    assert api.kwargs[0]["_request_timeout"] == progress.REQUEST_TIMEOUT_SECONDS


def test_a_script_that_reports_itself_owns_the_progress_and_nothing_is_counted_twice() -> None:
    api = FakeApi()
    counter = autoprogress.StepCounter()
    auto = autoprogress.AutoReporter(counter, autoprogress.RuntimeReporter(environ=ENV, api=api))
    assert not progress.script_reports(), "the runtime's own reporter claims nothing"
    script = ProgressReporter(environ=ENV, api=api)
    counter()
    auto.send()  # the script made a reporter but did not report yet (it sleeps or checkpoints first): nothing
    script.report(epoch=0, step=1, global_step=101)  # resumed at 100
    counter()
    auto.send()
    auto.close()
    assert script.drain(5) and auto.reporter.drain(5)
    steps = [(b["globalStep"], b["source"]) for b in api.bodies if "globalStep" in b]
    assert steps == [(101, "Reporter")]
    # That the script returned is the runtime's to say, whoever reports the steps.
    assert [sorted(b) for b in api.bodies if "globalStep" not in b] == [["finishTime"]]


def test_the_thread_announces_the_new_group_then_reports_after_the_first_step() -> None:
    api = FakeApi()
    counter = autoprogress.StepCounter()
    auto = autoprogress.AutoReporter(counter, autoprogress.RuntimeReporter(environ=ENV, api=api), interval=3600,
                                     grace=0)
    thread = threading.Thread(target=auto.run, daemon=True)
    thread.start()
    assert api.sent.wait(10)
    # Only this group's values: the operator reads older first-step times as the previous group's.
    assert api.bodies == [{"start": {"restartCount": 2, "rendezvousTime": "1970-01-01T00:16:40.250Z"}}]
    api.sent.clear()
    counter()
    assert api.sent.wait(10)
    assert api.bodies[-1]["globalStep"] == 1
    counter()
    auto.close()  # the script returned: its final count goes out, and the thread ends
    thread.join(10)
    assert auto.reporter.drain(5)
    counts = [b["globalStep"] for b in api.bodies if "globalStep" in b]
    assert not thread.is_alive() and counts[-1] == 2 and "finishTime" in api.bodies[-1]


def test_a_returned_script_says_so_after_its_last_count() -> None:
    """The operator's stall clocks stop waiting for a step at finishTime (policies/stall.py); close() has sent both
    before it returns, so the trainer's exit cannot cut them off."""
    api, clock = FakeApi(), Clock()
    counter = autoprogress.StepCounter(clock)
    auto = autoprogress.AutoReporter(counter, autoprogress.RuntimeReporter(environ=ENV, api=api))
    clock.t = 1001.0
    counter()
    auto.close()
    # One merged patch or two, in this order: the last count, then the finish (milliseconds, as lastStepTime).
    sent = sender.merged(*api.bodies) if len(api.bodies) == 2 else api.bodies[0]
    assert sent["globalStep"] == 1 and sent["lastStepTime"] == "1970-01-01T00:16:41.000Z", api.bodies
    assert "finishTime" in api.bodies[-1] and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z",
                                                           sent["finishTime"]), api.bodies


def test_nothing_is_installed_where_no_report_could_go() -> None:
    assert autoprogress.install({**ENV, "RANK": "1"}) is None
    assert autoprogress.install({**ENV, contract.DDPJOB_REPORT_PROGRESS: "0"}) is None


def test_install_counts_every_optimizer_step_on_rank_0(tmp_path: Any) -> None:
    """The real torch hook: an SGD and an Adam subclass both count; a plain tensor update does not."""
    env = {**ENV, contract.DDPJOB_REPORT_PROGRESS: "0", contract.DDPJOB_PROGRESS_FILE: str(tmp_path / "p.json")}
    auto = autoprogress.install(env)
    assert auto is not None
    try:
        w = torch.nn.Parameter(torch.ones(2))

        class MyAdam(torch.optim.Adam):
            pass

        for opt in (torch.optim.SGD([w], lr=0.1), MyAdam([w])):
            for _ in range(3):
                w.sum().backward()  # type: ignore[no-untyped-call]
                opt.step()
        with torch.no_grad():
            w.sub_(0.1)  # no optimizer: not a step
        assert auto.counter.steps == 6
    finally:
        auto.close()
    torch.optim.SGD([w], lr=0.1).step()
    assert auto.counter.steps == 6, "close() removes the hook"


def test_after_a_resume_the_count_goes_on_from_the_optimizers_own_step() -> None:
    """The script's step, not this process's: an Adam restored at step 100 reports 101 after its next step (the
    incident's "training at global step" and `kubectl get ddpj` STEP then show the script's step)."""
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(2, 1)
    first = torch.optim.AdamW(model.parameters())
    for _ in range(100):
        model(torch.ones(1, 2)).sum().backward()
        first.step()
    resumed = torch.optim.AdamW(model.parameters())
    resumed.load_state_dict(first.state_dict())
    counter = autoprogress.StepCounter()
    model(torch.ones(1, 2)).sum().backward()
    resumed.step()
    counter(resumed, (), {})
    assert counter.steps == 101
    resumed.step()
    counter(resumed, (), {})
    assert counter.steps == 102


def test_a_checkpoint_loaded_after_dcps_initialising_step_is_read_at_the_next_step() -> None:
    """torch.distributed.checkpoint's get_state_dict steps an empty optimizer once (lr 0) to create its state, before
    the script's dcp.load puts the checkpoint's state in: the count must follow the loaded step, not stay at 1."""
    torch = pytest.importorskip("torch")
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model = torch.nn.Linear(2, 1)
    first = torch.optim.Adam(model.parameters())
    for _ in range(60):
        model(torch.ones(1, 2)).sum().backward()
        first.step()
    _, saved = get_state_dict(model, first)
    counter = autoprogress.StepCounter()
    from torch.optim.optimizer import register_optimizer_step_post_hook

    hook = register_optimizer_step_post_hook(counter)
    try:
        model.zero_grad(set_to_none=True)  # a fresh process: no gradients yet (torch skips its step otherwise)
        resumed = torch.optim.Adam(model.parameters())
        get_state_dict(model, resumed)  # the initialising step: counted as this process's first
        assert counter.steps == 1
        set_state_dict(model, resumed, model_state_dict=model.state_dict(), optim_state_dict=saved)
        model(torch.ones(1, 2)).sum().backward()
        resumed.step()
        assert counter.steps == 61
        resumed.step()
        assert counter.steps == 62
    finally:
        hook.remove()


def test_two_optimizers_each_count_their_steps() -> None:
    """A GAN-style script with two optimizers: each step() counts once; neither resets the other's count."""
    torch = pytest.importorskip("torch")
    a, b = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    oa, ob = torch.optim.Adam(a.parameters()), torch.optim.Adam(b.parameters())
    counter = autoprogress.StepCounter()
    for _ in range(3):
        for model, opt in ((a, oa), (b, ob)):
            model(torch.ones(1, 2)).sum().backward()
            opt.step()
            counter(opt, (), {})
    assert counter.steps == 6


def test_an_optimizer_without_a_step_count_counts_from_this_process() -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(2, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    sgd.step()
    counter = autoprogress.StepCounter()
    counter(sgd, (), {})
    assert counter.steps == 1

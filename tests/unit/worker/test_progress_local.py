"""The progress reporter (file and cluster paths, fail-soft) and the local runner's command mapping."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from ddpjob_operator.cli.local_run import agent_argv
from ddpjob_worker import contract
from ddpjob_worker.progress import ProgressReporter


class FakeApi:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.kwargs: list[dict[str, Any]] = []
        self.fail = fail

    def patch_namespaced_custom_object_status(self, *args: Any, **kwargs: Any) -> None:
        if self.fail:
            raise RuntimeError("403 Forbidden")
        self.calls.append(args)
        self.kwargs.append(kwargs)


ENV = {contract.DDPJOB_NAME: "charlm", contract.DDPJOB_NAMESPACE: "ml", contract.DDPJOB_REPORT_PROGRESS: "1",
       "RANK": "0"}


def test_merge_patches_status_progress_throttled() -> None:
    api = FakeApi()
    reporter = ProgressReporter(environ=ENV, api=api, interval_seconds=3600)
    reporter.report(epoch=1, step=2, global_step=12, loss=1.5)
    assert reporter.drain(5)
    reporter.report(epoch=1, step=3, global_step=13, loss=1.4)  # throttled
    reporter.report(epoch=1, step=4, global_step=14, checkpoint_step=14, checkpoint_time=0, force=True)
    assert reporter.drain(5)
    assert len(api.calls) == 2
    group, version, ns, plural, name, body = api.calls[-1]
    assert (group, version, ns, plural, name) == ("ddpjob.io", "v1alpha1", "ml", "ddpjobs", "charlm")
    assert body["status"]["progress"]["globalStep"] == 14
    assert body["status"]["progress"]["lastCheckpoint"] == {"step": 14, "time": "1970-01-01T00:00:00Z"}
    assert api.kwargs[-1]["_content_type"] == "application/merge-patch+json"


def test_fails_soft_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    logging.getLogger("ddpjob").addHandler(caplog.handler)
    try:
        reporter = ProgressReporter(environ=ENV, api=FakeApi(fail=True), interval_seconds=0)
        for i in range(3):
            reporter.report(epoch=0, step=i, global_step=i)
            assert reporter.drain(5)
    finally:
        logging.getLogger("ddpjob").removeHandler(caplog.handler)
    assert caplog.text.count("cannot patch ddpjobs/charlm") == 1


def test_only_rank0_reports_and_local_file_is_written(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    api = FakeApi()
    ProgressReporter(environ={**ENV, "RANK": "1", contract.DDPJOB_PROGRESS_FILE: str(path)}, api=api).report(
        epoch=0, step=1, global_step=1)
    assert not path.exists() and not api.calls
    ProgressReporter(environ={**ENV, contract.DDPJOB_REPORT_PROGRESS: "0", contract.DDPJOB_PROGRESS_FILE: str(path)},
                     api=api).report(epoch=0, step=1, global_step=1, loss=2.0)
    assert json.loads(path.read_text())["loss"] == 2.0 and not api.calls


def test_agent_argv_follows_kubernetes_command_and_args() -> None:
    bindir = Path(sys.executable).parent
    assert agent_argv({"args": ["python", "t.py"]}, bindir) == [sys.executable, "-m", "ddpjob_worker.entrypoint",
                                                                "python", "t.py"]
    assert agent_argv({"command": ["ddp-worker"], "args": ["t.py"]}, bindir)[1:] == ["-m",
                                                                                    "ddpjob_worker.entrypoint", "t.py"]
    assert agent_argv({"command": ["python", "t.py"]}, bindir) == [sys.executable, "t.py"]


def test_a_known_total_goes_out_with_every_report() -> None:
    api = FakeApi()
    reporter = ProgressReporter(environ=ENV, api=api, interval_seconds=0, total_steps=300)
    reporter.report(epoch=0, step=1, global_step=1)
    assert reporter.drain(5)
    reporter.total_steps = 450  # e.g. once the data set's size is known
    reporter.report(epoch=0, step=2, global_step=2)
    assert reporter.drain(5)
    assert [c[-1]["status"]["progress"]["totalSteps"] for c in api.calls] == [300, 450]
    quiet = FakeApi()
    unknown = ProgressReporter(environ=ENV, api=quiet, interval_seconds=0)
    unknown.report(epoch=0, step=1, global_step=1)
    assert unknown.drain(5)
    assert len(quiet.calls) == 1 and "totalSteps" not in quiet.calls[0][-1]["status"]["progress"]


def test_a_checkpoints_write_and_load_seconds_go_out_with_it() -> None:
    api = FakeApi()
    reporter = ProgressReporter(environ=ENV, api=api, interval_seconds=0)
    reporter.resumed(at=0, seconds=1.23456)
    reporter.report(epoch=0, step=5, global_step=5, checkpoint_step=5, checkpoint_time=0, checkpoint_seconds=0.0423)
    assert reporter.drain(5)
    progress = api.calls[-1][-1]["status"]["progress"]
    assert progress["lastCheckpoint"] == {"step": 5, "time": "1970-01-01T00:00:00Z", "seconds": 0.042}
    assert progress["start"]["checkpointLoadSeconds"] == 1.235
    fresh = ProgressReporter(environ=ENV, api=FakeApi(), interval_seconds=0)
    fresh.resumed(at=0)  # nothing was loaded (a first start): no load figure
    assert "checkpointLoadSeconds" not in fresh.start


@pytest.mark.parametrize("loss", [float("nan"), float("inf"), -float("inf")])
def test_a_diverged_loss_does_not_make_the_report_invalid_json(loss: float) -> None:
    """The API server refuses NaN (no JSON has it): every report would fail and the job would look stalled."""
    api = FakeApi()
    reporter = ProgressReporter(environ=ENV, api=api, interval_seconds=0)
    reporter.report(epoch=0, step=1, global_step=1, loss=loss)
    assert reporter.drain(5)
    body = api.calls[-1][-1]
    json.dumps(body, allow_nan=False)
    assert body["status"]["progress"]["loss"] is None and body["status"]["progress"]["globalStep"] == 1

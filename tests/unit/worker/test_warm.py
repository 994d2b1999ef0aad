"""Pre-started trainers: the pool hands a waiting process its worker environment over the pipe, never hands out
one that cannot run the worker, refills only after its delay; a real standby runs the script with exactly the
environment it was sent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ddpjob_worker import contract, procs, warm

from tests.worker.helpers import wait_until

# A waiting process that writes what it reads on stdin to the file named by its argument.
ECHO = [sys.executable, "-c", "import sys; open(sys.argv[1], 'w').write(sys.stdin.read())"]


@pytest.fixture
def pool() -> object:
    p = warm.Pool()
    yield p
    p.close()


@pytest.mark.parametrize(("value", "expected"), [
    (None, True), ("1", True), ("0", False), ("false", False), ("OFF", False), ("no", False), ("yes", True),
])
def test_enabled(value: str | None, expected: bool) -> None:
    environ = {} if value is None else {contract.DDPJOB_WARM_TRAINERS: value}
    assert warm.enabled(environ) is expected


def test_startup_env_keeps_what_is_read_at_interpreter_start() -> None:
    environ = {"PYTHONPATH": "/x", "OMP_NUM_THREADS": "2", "CUDA_VISIBLE_DEVICES": "1", "RANK": "3", "HOME": "/"}
    assert warm.startup_env(environ) == {"PYTHONPATH": "/x", "OMP_NUM_THREADS": "2", "CUDA_VISIBLE_DEVICES": "1"}


def test_warmable_only_under_the_recorded_runner() -> None:
    assert warm.warmable(["python", "-u", "-m", "ddpjob_worker.recorded", "--module", "m"])
    assert not warm.warmable(["/bin/train.sh", "--lr", "1"])


def test_take_sends_the_environment_and_closes_the_pipe(pool: warm.Pool, tmp_path: Path) -> None:
    out = tmp_path / "got"
    argv = [*ECHO, str(out)]
    pool.start(argv, 0, {**os.environ, "OMP_NUM_THREADS": "1"})
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RANK": "5"}
    proc = pool.take(argv, 0, env)
    assert proc is not None
    assert proc.wait(30) == 0
    assert json.loads(out.read_text())["env"] == env
    assert pool.take(argv, 0, env) is None  # handed out once


def test_a_changed_startup_environment_starts_cold_and_kills_the_waiting_one(pool: warm.Pool, tmp_path: Path) -> None:
    argv = [*ECHO, str(tmp_path / "got")]
    pool.start(argv, 0, {**os.environ, "CUDA_VISIBLE_DEVICES": "0"})
    waiting = pool._waiting[(tuple(argv), 0)][0]
    assert pool.take(argv, 0, {**os.environ, "CUDA_VISIBLE_DEVICES": "1"}) is None
    assert waiting.poll() is not None
    got = tmp_path / "got"
    assert not got.exists() or not got.read_text()  # killed, and nothing was sent to it


def test_a_dead_waiting_process_starts_cold(pool: warm.Pool) -> None:
    argv = [sys.executable, "-c", "raise SystemExit(3)"]
    pool.start(argv, 1, dict(os.environ))
    pool._waiting[(tuple(argv), 1)][0].wait(30)
    assert pool.take(argv, 1, dict(os.environ)) is None


def test_refill_waits_for_its_delay_then_starts_with_the_workers_startup_env(pool: warm.Pool,
                                                                            tmp_path: Path) -> None:
    argv = [*ECHO, str(tmp_path / "got")]
    assert pool.take(argv, 0, {**os.environ, "CUDA_VISIBLE_DEVICES": "3"}) is None  # nothing waited: cold
    key = (tuple(argv), 0)
    _, due = pool._wanted[key]
    pool.refill(now=due - 1)
    assert key not in pool._waiting
    pool.refill(now=due)
    proc, started_with = pool._waiting[key]
    assert started_with["CUDA_VISIBLE_DEVICES"] == "3"  # the next worker of this rank can use it
    pool.close()
    assert proc.poll() is not None


@pytest.mark.timeout(120)
def test_standby_runs_the_script_with_the_environment_it_was_sent(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import os, sys\n"
                      "print(os.environ.get('RANK'), os.environ.get('DDPJOB_STANDBY'), os.getenv('GONE'),\n"
                      "      os.readlink('/proc/self/fd/0'), open('/proc/self/comm').read().strip(), sys.argv[1:])\n")
    argv = [sys.executable, "-m", "ddpjob_worker.recorded", str(script), "a1"]
    start_env = {**os.environ, contract.DDPJOB_STANDBY: "1", "GONE": "x"}
    proc = subprocess.Popen(argv, env=start_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        procs_env = {k: v for k, v in os.environ.items() if k != "GONE"}
        assert proc.stdin is not None
        proc.stdin.write(json.dumps({"env": {**procs_env, "RANK": "7"}}) + "\n")
        proc.stdin.close()
        assert proc.wait(100) == 0
        assert proc.stdout is not None
        out = proc.stdout.read()
    finally:
        proc.kill()
    rank, standby, gone, stdin, name, args = out.strip().split(" ", 5)
    assert (rank, standby, gone, stdin) == ("7", "None", "None", os.devnull)
    assert name != contract.STANDBY_PROCESS_NAME and args == "['a1']"


@pytest.mark.timeout(120)
def test_standby_exits_0_without_running_when_the_agent_closes_the_pipe(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    proc = subprocess.Popen([sys.executable, "-m", "ddpjob_worker.recorded", str(script)],
                            env={**os.environ, contract.DDPJOB_STANDBY: "1"}, stdin=subprocess.PIPE)
    try:
        # Between fork and exec /proc/PID/environ is still this process's (no DDPJOB_STANDBY): wait for the exec.
        wait_until(lambda: procs.is_standby(proc.pid), 30, "the standby's exec")
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(100) == 0
    finally:
        proc.kill()
    assert not marker.exists()


LAUNCH = ["--module", "ddpjob_worker.recorded", "--module", "train", "--rank=${local_rank}", "--lr", "0.1"]


@pytest.mark.parametrize(("argv", "environ", "expected"), [
    (LAUNCH, {"PET_NPROC_PER_NODE": "2", "PYTHON_EXEC": "/py"},
     [("/py", "-u", "-m", "ddpjob_worker.recorded", "--module", "train", "--rank=0", "--lr", "0.1"),
      ("/py", "-u", "-m", "ddpjob_worker.recorded", "--module", "train", "--rank=1", "--lr", "0.1")]),
    (["--module", "ddpjob_worker.recorded", "train.py"], {},
     [(sys.executable, "-u", "-m", "ddpjob_worker.recorded", "train.py")]),
    (["--module", "ddpjob_worker.recorded", "t.py"], {"PET_NPROC_PER_NODE": "cpu", "PYTHON_EXEC": "p"},
     [("p", "-u", "-m", "ddpjob_worker.recorded", "t.py")] * (os.cpu_count() or 1)),
    # torch substitutes with string.Template: the short form too, and $$ is a literal $
    (["--module", "ddpjob_worker.recorded", "t.py", "--out=/o/$local_rank", "--cost=$$5"], {"PYTHON_EXEC": "p"},
     [("p", "-u", "-m", "ddpjob_worker.recorded", "t.py", "--out=/o/0", "--cost=$5")]),
    (LAUNCH, {"PET_NPROC_PER_NODE": "gpu"}, []),  # counting GPUs needs torch: the agent starts them later
    (LAUNCH, {"PET_NO_PYTHON": "1"}, []),
    (["--no-python", "./train"], {}, []),
    (["train.py"], {}, []),
])
def test_launch_worker_argvs_match_torchruns_worker_command(argv: list[str], environ: dict[str, str],
                                                            expected: list[tuple[str, ...]]) -> None:
    assert warm.launch_worker_argvs(argv, environ) == expected


def test_ensure_keeps_a_matching_launch_trainer_and_replaces_a_mismatched_one(pool: warm.Pool) -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    pool.start(sleeper, 0, {"PATH": "/bin"})
    first = pool.pid(sleeper, 0)
    pool.ensure(sleeper, 0, {"PATH": "/bin", "OTHER": "x"})  # only startup keys matter
    assert pool.pid(sleeper, 0) == first
    pool.ensure(sleeper, 0, {"PATH": "/usr/bin"})
    assert pool.pid(sleeper, 0) not in (None, first)
    assert first is not None and not procs.alive(first)


def test_keep_only_stops_a_wrong_launch_guess(pool: warm.Pool) -> None:
    guessed = [sys.executable, "-c", "import time; time.sleep(60)", "guess"]
    pool.start(guessed, 0, {})
    pid = pool.pid(guessed, 0)
    pool.keep_only({(("python", "other"), 0)})
    assert pool.pid(guessed, 0) is None and pid is not None and not procs.alive(pid)

"""The recorded runner: any script or module runs as ``__main__`` with its argv and exit code, and an exception
leaves a torchelastic error file (what the agent reads for the root cause and for peer-loss detection)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ddpjob_worker import causes, recorded

# record enables faulthandler on stderr, which pytest's capture replaces with a file without a descriptor.
pytestmark = pytest.mark.filterwarnings("ignore:Unable to enable fault handler")

SCRIPT = """\
import sys
from helper import VALUE  # the script's own folder is on sys.path, as with `python script.py`
if __name__ == "__main__":
    print("ARGV", sys.argv, VALUE)
    if sys.argv[1] == "raise":
        raise ValueError("bad lr " + sys.argv[2])
    sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def error_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("helper", "trainpkg", "trainpkg.helper"):  # each test imports the scripts afresh
        monkeypatch.delitem(sys.modules, name, raising=False)
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text(SCRIPT)
    (tmp_path / "code" / "helper.py").write_text("VALUE = 42\n")
    (tmp_path / "code" / "trainpkg").mkdir()
    (tmp_path / "code" / "trainpkg" / "__init__.py").write_text("")
    (tmp_path / "code" / "trainpkg" / "main.py").write_text(SCRIPT.replace("from helper", "from trainpkg.helper"))
    (tmp_path / "code" / "trainpkg" / "helper.py").write_text("VALUE = 7\n")
    return path


def test_script_exception_leaves_an_error_file(error_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = str(error_file.parent / "code" / "train.py")
    with pytest.raises(ValueError, match=r"bad lr 0\.1"):  # python then prints it and exits 1, as without us
        recorded.main([script, "raise", "0.1"])
    assert f"ARGV ['{script}', 'raise', '0.1'] 42" in capsys.readouterr().out
    data = json.loads(error_file.read_text())
    assert data["message"]["message"] == "ValueError: bad lr 0.1"
    assert "train.py" in data["message"]["extraInfo"]["py_callstack"]


@pytest.mark.parametrize("code", [0, 3])
def test_exit_codes_are_kept(error_file: Path, code: int) -> None:
    script = str(error_file.parent / "code" / "train.py")
    if code:
        with pytest.raises(SystemExit) as exited:
            recorded.main([script, str(code)])
        assert exited.value.code == code
    else:
        recorded.main([script, "0"])  # record turns exit(0) into a return: python then exits 0
    assert not error_file.exists()  # an exit the script chose is no crash


def test_module_runs_as_main(error_file: Path, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.syspath_prepend(str(error_file.parent / "code"))  # `python -m` finds modules from the cwd
    with pytest.raises(ValueError, match="bad lr x"):
        recorded.main(["--module", "trainpkg.main", "raise", "x"])
    out = capsys.readouterr().out
    assert "trainpkg/main.py', 'raise', 'x'] 7" in out
    assert json.loads(error_file.read_text())["message"]["message"] == "ValueError: bad lr x"


def test_usage_without_a_target() -> None:
    with pytest.raises(SystemExit) as exited:
        recorded.main(["--module"])
    assert exited.value.code == 2


LEAVING = """\
import atexit, sys, threading, time
out = sys.argv[1]
log = open(out + "/unflushed.txt", "w")  # never closed or flushed by the script
log.write("kept")
def late():
    time.sleep(0.3)
    open(out + "/thread.txt", "w").write("done")
threading.Thread(target=late).start()  # a non-daemon thread still working, like a background checkpoint write
atexit.register(lambda: open(out + "/atexit.txt", "w").write("ran"))
class Teardown:
    def __del__(self):
        open(out + "/teardown.txt", "w").write("ran")
keep = Teardown()  # finalized only by the interpreter's teardown, which a failed trainer skips
if sys.argv[2] == "raise":
    raise ValueError("boom")
sys.exit(int(sys.argv[2]))
"""


@pytest.mark.parametrize(("how", "code"), [("raise", 1), ("143", 143), ("0", 0)])
def test_a_trainer_leaves_at_once_but_keeps_what_the_teardown_would_save(
        tmp_path: Path, how: str, code: int) -> None:
    script = tmp_path / "leaving.py"
    script.write_text(LEAVING)
    env = {**os.environ, "TORCHELASTIC_ERROR_FILE": str(tmp_path / "error.json")}
    done = subprocess.run([sys.executable, "-m", "ddpjob_worker.recorded", str(script), str(tmp_path), how],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stderr
    assert (tmp_path / "thread.txt").read_text() == "done"
    assert (tmp_path / "atexit.txt").read_text() == "ran"
    assert ("Traceback" in done.stderr and "ValueError: boom" in done.stderr) == (how == "raise")
    # No trainer goes through the interpreter's teardown (slow with torch loaded, and able to abort: recorded.cli);
    # every open file is flushed first (which that teardown does not even promise for a script run as __main__).
    assert not (tmp_path / "teardown.txt").exists()
    assert (tmp_path / "unflushed.txt").read_text() == "kept"


def test_rank1_waits_for_rank0s_store_to_listen() -> None:
    import socket
    import threading
    import time

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {"RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    listener = socket.socket()

    def listen_later() -> None:
        time.sleep(0.5)
        listener.bind(("127.0.0.1", port))
        listener.listen()

    started = time.monotonic()
    thread = threading.Thread(target=listen_later)
    thread.start()
    try:
        assert recorded.await_rank0_store(env, timeout=20)
        assert time.monotonic() - started >= 0.5
    finally:
        thread.join()
        listener.close()
    assert not recorded.await_rank0_store({**env, "RANK": "0"})  # rank 0 hosts it: nothing to wait for
    assert not recorded.await_rank0_store({**env, "TORCHELASTIC_USE_AGENT_STORE": "True"})
    assert not recorded.await_rank0_store({"RANK": "1"})
    started = time.monotonic()
    assert not recorded.await_rank0_store(env, timeout=0.3)  # nobody listens: torch's own retries take over
    assert time.monotonic() - started < 5


LIGHTNING_PEER_STOP = """\
class SIGTERMException(SystemExit):  # as lightning.pytorch.utilities.exceptions names it
    pass
class Trainer:
    received_sigterm = {received}
def _call_and_handle_interrupt(trainer):
    raise SIGTERMException
_call_and_handle_interrupt(Trainer())
"""


@pytest.mark.parametrize("received", [False, True])
def test_a_rank_stopped_for_a_peers_sigterm_fails_as_a_peer_loss(error_file: Path, received: bool) -> None:
    """Lightning's SIGTERMException reaches the other ranks by broadcast and exits them 0: torchrun would take the
    group for finished. Unless this process got the SIGTERM itself, it becomes a failure the agent reads as a
    peer's loss (ddpjob_worker.frameworks)."""
    script = error_file.parent / "code" / "lit.py"
    script.write_text(LIGHTNING_PEER_STOP.format(received=received))
    if received:  # this pod is being stopped: the framework's exit (no code: 0) stands
        with pytest.raises(SystemExit) as stop:
            recorded.main([str(script)])
        assert stop.value.code is None and not error_file.exists()
        return
    with pytest.raises(RuntimeError, match="another rank received SIGTERM") as raised:
        recorded.main([str(script)])
    assert type(raised.value).__name__ == "PeerStopped"
    text = error_file.read_text()
    assert "PeerStopped" in text
    assert causes.is_peer_loss(text)

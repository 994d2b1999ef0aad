"""The recorded runner: any script or module runs as ``__main__`` with its argv and exit code, and an exception
leaves a torchelastic error file (what the agent reads for the root cause and for peer-loss detection)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from ddpjob_worker import recorded

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

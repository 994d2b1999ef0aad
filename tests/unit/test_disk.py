"""What the builds keep on disk (issue 44, #9): hack/disk.sh reports the project's footprint against a budget, and
hack/lib/prune-unused.sh removes the superseded cache entries no checkout used for days (hack/venv.sh's venvs)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

HACK = Path(__file__).parents[2] / "hack"
DAY = 86400.0


def _aged(path: Path, days: float) -> Path:
    t = time.time() - days * DAY
    os.utime(path, (t, t))
    return path


def _prune(days: str, current: Path, *dirs: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(HACK / "lib" / "prune-unused.sh"), days, str(current), *map(str, dirs)],
                          capture_output=True, text=True, timeout=30)


def test_prune_removes_only_entries_unused_for_the_given_days(tmp_path: Path) -> None:
    current, stale, recent, old_complete, fresh_complete = (tmp_path / n for n in (
        "deps-current", "deps-stale", "deps-recent", "deps-old-complete", "deps-fresh-complete"))
    for d in (current, stale, recent, old_complete, fresh_complete):
        d.mkdir()
    _aged(current, 30)  # the one in use is kept whatever its age
    for mark in (stale / ".complete", stale / ".last-used", recent / ".complete", recent / ".last-used",
                 old_complete / ".complete", fresh_complete / ".complete"):
        mark.touch()
    _aged(stale / ".last-used", 10)  # used last 10 days ago: removed
    _aged(recent / ".complete", 30)  # installed long ago, used today: kept
    _aged(old_complete / ".complete", 8)  # from before .last-used: its install's age counts
    r = _prune("7", current, current, stale, recent, old_complete, fresh_complete, tmp_path / "deps-*")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deps-current", "deps-fresh-complete", "deps-recent"]
    assert f"removing {stale} (unused for 7 days or more)" in r.stdout
    assert str(old_complete) in r.stdout


def test_prune_refuses_a_keep_that_is_not_a_number(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    r = _prune("seven", tmp_path / "b", tmp_path / "a")
    assert r.returncode == 2 and "KEEP_DAYS=seven" in r.stderr
    assert (tmp_path / "a").exists()


def _disk(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home"), "DDPJOB_CACHE": str(tmp_path / "cache"),
            "DDPJOB_DOCKER_ROOT": str(tmp_path / "docker"), "GOMODCACHE": str(tmp_path / "gomod"),
            "GOCACHE": str(tmp_path / "gobuild"), "GOFLAGS": "", "GOENV": "off"}
    return subprocess.run(["bash", str(HACK / "disk.sh"), *args], capture_output=True, text=True, timeout=60,
                          env={**base, **env})


def _file(path: Path, mb: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(mb << 20))
    return path


def test_disk_reports_each_place_counts_a_hard_link_once_and_holds_the_budget(tmp_path: Path) -> None:
    big = _file(tmp_path / "cache" / "node-images" / "k" / "blob", 3)
    _file(tmp_path / "cache" / "venvs" / "deps-a" / "torch.so", 2)
    _file(tmp_path / "docker" / "overlay2" / "layer", 1)
    (tmp_path / "cache" / "bin").mkdir()
    os.link(big, tmp_path / "cache" / "bin" / "blob")
    r = _disk(tmp_path, DDPJOB_DISK_BUDGET_GB="1")
    assert r.returncode == 0, r.stderr
    sizes = {line.split()[1]: int(line.split()[0]) for line in r.stdout.splitlines()[1:-1]}
    assert sizes[str(tmp_path / "cache" / "venvs" / "deps-a")] >= 2
    assert str(tmp_path / "docker") in sizes
    total = int(r.stdout.splitlines()[-1].split()[0])
    assert 6 <= total < 9  # 3 + 2 + 1 MB (and directories): the 3 MB hard-linked twice counted once
    assert "budget 1 GB" in r.stdout

    over = _disk(tmp_path, DDPJOB_DISK_BUDGET_GB="0")
    assert over.returncode == 1
    assert "over the budget" in over.stderr and "DDPJOB_DISK_BUDGET_GB" in over.stderr
    assert _disk(tmp_path, "--warn", DDPJOB_DISK_BUDGET_GB="0").returncode == 0

    bad = _disk(tmp_path, DDPJOB_DISK_BUDGET_GB="lots")
    assert bad.returncode == 2 and "DDPJOB_DISK_BUDGET_GB=lots" in bad.stderr

"""The injected runtime's checks of a user's image (bootstrap.py): pure parts."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from types import SimpleNamespace

import pytest
from ddpjob_worker import bootstrap

pytestmark = pytest.mark.unit


def no_metadata(name: str) -> str:
    raise importlib.metadata.PackageNotFoundError(name)


@pytest.mark.parametrize(("torch", "problem"), [
    pytest.param(None, "cannot import torch; the injected ddpjob runtime runs torchrun with the image's own Python",
                 id="no-torch"),
    pytest.param("2.4.1+cu121", "has torch 2.4.1+cu121, older than the oldest supported (2.6)", id="too-old"),
    pytest.param("2.6.0", None, id="oldest"),
    pytest.param("2.6.0a0+ecf3bae40a.nv25.01", None, id="vendor-build"),
    pytest.param("2.15.0+cu132", None, id="newest"),
    pytest.param("2.16.0.dev20270101", None, id="newer-runs"),
])
def test_image_problem(torch: str | None, problem: str | None) -> None:
    found = bootstrap.image_problem("plain:1", "/usr/bin/python3 (Python 3.11.2)", torch)
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith("image plain:1: /usr/bin/python3 (Python 3.11.2)")
        assert problem in found and "2.6 to 2.15" in found


def test_newer_torch_is_only_a_warning() -> None:
    assert bootstrap.torch_warning("2.15.0") is None
    assert "outside the tested range" in (bootstrap.torch_warning("2.16.0") or "")
    assert "outside the tested range" in (bootstrap.torch_warning("unknown") or "")


def test_torch_version_without_importing_it(tmp_path: Path) -> None:
    assert bootstrap.torch_version(lambda _: None) is None
    assert bootstrap.torch_version(lambda _: object(), lambda _: "2.8.0") == "2.8.0"
    (tmp_path / "version.py").write_text("__version__ = '2.7.0a0+git1234'\ngit_version = 'x'\n")
    source_build = SimpleNamespace(submodule_search_locations=[str(tmp_path)])
    assert bootstrap.torch_version(lambda _: source_build, no_metadata) == "2.7.0a0+git1234"
    assert bootstrap.torch_version(lambda _: SimpleNamespace(), no_metadata) == "unknown"


def test_runtime_goes_first_on_pythonpath_and_the_images_stays() -> None:
    env: dict[str, str] = {"PYTHONPATH": "/app:/ddpjob/lib"}
    bootstrap.put_on_pythonpath("/ddpjob/lib", env)
    assert env["PYTHONPATH"] == "/ddpjob/lib:/app"
    empty: dict[str, str] = {}
    bootstrap.put_on_pythonpath("/ddpjob/lib", empty)
    assert empty["PYTHONPATH"] == "/ddpjob/lib"

"""The saved copy of the real nodes' images (tests/cluster/node_images.py): a copy is saved only when node 0 still
holds the sandbox and probe images and every imported one, and restored only when its list holds them. On
2026-12-06 a kubelet's disk eviction deleted pause during an import, that copy was saved, and every later e2e run
restored nodes on which no pod could start. ``ctr`` and the hard-link copy need real nodes: they are stubbed here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cluster import node_images
from tests.cluster.controlplane import StartError
from tests.cluster.node import NodeState

PAUSE, PROBE = "ddpjob.local/pause:3.10", "ddpjob.local/probe:1"
WORKER = "ddpjob-worker:dev"
Node = tuple[NodeState, list[str], list[str]]


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Node:
    """A node whose containerd holds ``holds`` (mutable); ``shared`` records every share() call's source/also."""
    holds = [PAUSE, PROBE]
    shared: list[str] = []
    monkeypatch.setattr(node_images, "_ctr", lambda ns, *a: "\n".join(holds) + "\n" if a == ("images", "ls", "-q")
                        else pytest.fail(f"unexpected ctr {a}"))

    def share(ns: NodeState, *, source: Path | None = None, also: tuple[Path, ...] = ()) -> None:
        for d in also:
            d.mkdir(parents=True)
        shared.append(f"source={source} also={list(also)}")

    monkeypatch.setattr(node_images, "share", share)
    (tmp_path / "cluster").mkdir()
    return NodeState(dir=str(tmp_path / "cluster"), nodes=2), holds, shared


def test_required_is_what_node_0_holds_and_every_image_by_containerd_name(node: Node) -> None:
    ns, _, _ = node
    assert node_images.required(ns, [WORKER, "ghcr.example/x/y:1"]) == sorted(
        [PAUSE, PROBE, f"docker.io/library/{WORKER}", "ghcr.example/x/y:1"])


def test_a_copy_is_saved_with_its_list_and_restored(node: Node, tmp_path: Path) -> None:
    ns, holds, shared = node
    need = node_images.required(ns, [WORKER])
    holds.append(f"docker.io/library/{WORKER}")
    saved = tmp_path / "cache" / "key"
    node_images.save(ns, saved, need)
    assert json.loads((saved / ".complete").read_text())["images"] == sorted(holds)
    assert node_images.restore(ns, saved, need)
    assert shared[-1] == f"source={saved} also=[]"


def test_no_copy_is_saved_when_the_kubelet_deleted_pause(node: Node, tmp_path: Path) -> None:
    ns, holds, shared = node
    need = node_images.required(ns, [WORKER])
    holds[:] = [PROBE, f"docker.io/library/{WORKER}"]  # the eviction manager removed pause during the import
    saved = tmp_path / "cache" / "key"
    with pytest.raises(StartError, match=r"lost ddpjob.local/pause:3.10 .*eviction threshold"):
        node_images.save(ns, saved, need)
    assert not saved.exists() and shared == []


@pytest.mark.parametrize("complete", [
    "2026-12-06T10:00:00Z",  # a copy from before the list: what it holds is unknown
    json.dumps({"saved": "2026-12-06T10:00:00Z", "images": [PROBE, f"docker.io/library/{WORKER}"]}),  # no pause
    "{not json",
])
def test_a_copy_without_every_needed_image_is_not_restored(node: Node, tmp_path: Path, complete: str) -> None:
    ns, _, shared = node
    saved = tmp_path / "cache" / "key"
    saved.mkdir(parents=True)
    (saved / ".complete").write_text(complete)
    assert not node_images.restore(ns, saved, node_images.required(ns, [WORKER]))
    assert shared == []


def test_a_copy_lacking_an_image_is_removed(node: Node, tmp_path: Path) -> None:
    ns, _, _ = node
    saved = tmp_path / "cache" / "key"
    saved.mkdir(parents=True)
    (saved / ".complete").write_text(json.dumps({"images": [PROBE]}))
    assert not node_images.restore(ns, saved, node_images.required(ns, [WORKER]))
    assert not saved.exists()

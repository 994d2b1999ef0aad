"""What a script's checkpoint folder holds (ddpjob_worker.replication.units): checkpoints, families, completeness
of each framework's layout, and whole files by format."""

from __future__ import annotations

import io
import json
import struct
import zipfile
from pathlib import Path

import pytest
from ddpjob_worker.replication import units

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("path", "unit"), [
    ("hf/checkpoint-100/model.safetensors", "hf/checkpoint-100"),
    ("hf/checkpoint-100/nested/x.bin", "hf/checkpoint-100"),
    ("dcp/step-100/__0_0.distcp", "dcp/step-100"),
    ("dcp/step_7/.metadata", "dcp/step_7"),
    ("snapshot.pt", "snapshot.pt"),
    ("lightning/epoch=0-step=50.ckpt", "lightning/epoch=0-step=50.ckpt"),
    ("lightning/last.ckpt", "lightning/last.ckpt"),
    ("runs/events.out", "runs/events.out"),
])
def test_unit_of(path: str, unit: str) -> None:
    assert units.unit_of(path) == unit


@pytest.mark.parametrize(("unit", "family", "order"), [
    ("hf/checkpoint-100", ("hf", "checkpoint-#"), (100,)),
    ("lightning/epoch=1-step=200.ckpt", ("lightning", "epoch=#-step=#.ckpt"), (1, 200)),
    ("snapshot.pt", (".", "snapshot.pt"), ()),
])
def test_family_and_order(unit: str, family: tuple[str, str], order: tuple[int, ...]) -> None:
    assert units.family_of(unit) == family
    assert units.order_of(unit) == order


@pytest.mark.parametrize(("parts", "out"), [
    ((".errors", "worker-0.json"), True),
    ((".ddpjob-replica", "state.json"), True),
    (("dcp", "step-1", ".metadata"), False),
    (("dcp", "step-1", ".tmp123"), True),
    (("lost+found", "x"), True),
    (("hf", "checkpoint-1", "model.safetensors"), False),
])
def test_excluded(parts: tuple[str, ...], out: bool) -> None:
    assert units.excluded(parts) is out


@pytest.mark.parametrize(("unit", "files", "partial", "complete", "kind"), [
    pytest.param("hf/checkpoint-50", ["model.safetensors", "optimizer.pt", "rng_state_0.pth", "rng_state_1.pth",
                                      "trainer_state.json"], [], True, "hf", id="hf-complete"),
    pytest.param("hf/checkpoint-50", ["rng_state_1.pth"], [], False, "hf", id="hf-only-a-rank's-rng"),
    pytest.param("hf/checkpoint-50", ["model.safetensors", "optimizer.pt"], [], False, "hf", id="hf-no-state"),
    pytest.param("dcp/step-10", ["__0_0.distcp", "__1_0.distcp", ".metadata"], [], True, "dcp", id="dcp-complete"),
    pytest.param("dcp/step-10", ["__1_0.distcp"], [], False, "dcp", id="dcp-no-metadata"),
    pytest.param("dcp/step-10", ["__0_0.distcp", ".metadata"], ["__1_0.distcp"], False, "dcp",
                 id="dcp-partial-shard"),
    pytest.param("step-10", ["state.pt", "COMPLETE.json"], [], True, "checkpointer", id="checkpointer"),
    pytest.param("run/epoch_3", ["weights.pt"], [], True, "folder", id="plain-folder"),
])
def test_judge_folders(unit: str, files: list[str], partial: list[str], complete: bool, kind: str) -> None:
    j = units.judge(unit, [f"{unit}/{f}" for f in files], [f"{unit}/{p}" for p in partial])
    assert (j.complete, j.kind) == (complete, kind), j.why


def test_judge_a_file_of_its_own() -> None:
    assert units.judge("snapshot.pt", ["snapshot.pt"]).complete
    assert not units.judge("snapshot.pt", [], ["snapshot.pt"]).complete


def test_newest_complete_per_family() -> None:
    judged = {
        "hf/checkpoint-50": units.Judgement(True, "hf"),
        "hf/checkpoint-100": units.Judgement(True, "hf"),
        "hf/checkpoint-150": units.Judgement(False, "hf", "no trainer_state.json"),
        "l/epoch=0-step=9.ckpt": units.Judgement(True, "file"),
        "l/epoch=1-step=18.ckpt": units.Judgement(True, "file"),
        "snapshot.pt": units.Judgement(True, "file"),
    }
    assert units.newest_complete(judged) == {("hf", "checkpoint-#"): "hf/checkpoint-100",
                                             ("l", "epoch=#-step=#.ckpt"): "l/epoch=1-step=18.ckpt"}


def _zip_bytes() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", b"x" * 1000)
    return buf.getvalue()


def _safetensors(payload: int, claim: int) -> bytes:
    header = json.dumps({"w": {"dtype": "F32", "shape": [claim // 4], "data_offsets": [0, claim]}}).encode()
    return struct.pack("<Q", len(header)) + header + b"\0" * payload


@pytest.mark.parametrize(("name", "data", "whole"), [
    pytest.param("model.pt", _zip_bytes(), True, id="zip-whole"),
    pytest.param("model.pt", _zip_bytes()[:-10], False, id="zip-cut"),
    pytest.param("model.pt", _zip_bytes()[:300], False, id="zip-cut-early"),
    pytest.param("model.safetensors", _safetensors(64, 64), True, id="safetensors-whole"),
    pytest.param("model.safetensors", _safetensors(32, 64), False, id="safetensors-cut"),
    pytest.param("model.safetensors", b"\x10\0\0", False, id="safetensors-no-header"),
    pytest.param("trainer_state.json", b'{"global_step": 5}', True, id="json-whole"),
    pytest.param("trainer_state.json", b'{"global_step": ', False, id="json-cut"),
    pytest.param("notes.txt", b"anything", True, id="other-formats-by-quiet-time"),
])
def test_whole(tmp_path: Path, name: str, data: bytes, whole: bool) -> None:
    f = tmp_path / name
    f.write_bytes(data)
    assert units.whole(str(f), len(data)) is whole


def test_whole_of_a_real_torch_save(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    f = tmp_path / "snapshot.pt"
    torch.save({"MODEL_STATE": {"w": torch.ones(1000)}, "EPOCHS_RUN": 3}, f)
    data = f.read_bytes()
    assert units.whole(str(f), len(data))
    f.write_bytes(data[: len(data) // 2])
    assert not units.whole(str(f), len(data) // 2)


def test_an_hf_checkpoint_lacks_a_ranks_rng_file() -> None:
    """Rank 0 writes trainer_state.json with no barrier after the ranks' RNG files: a pod lost in between leaves a
    checkpoint with the marker and without that rank's file, which is not complete for the group that wrote it."""
    files = [f"hf/checkpoint-24/{f}" for f in ("model.safetensors", "rng_state_0.pth", "trainer_state.json")]
    assert not units.judge("hf/checkpoint-24", files, world=2).complete
    assert units.judge("hf/checkpoint-24", [*files, "hf/checkpoint-24/rng_state_1.pth"], world=2).complete
    assert units.judge("hf/checkpoint-24", files, world=0).complete, "unknown world: the marker decides"

"""The bookkeeping of replication (ledger) and the group's sync plan (groupsync.plan_sync), as tables."""

from __future__ import annotations

import pytest
from ddpjob_worker.replication.groupsync import plan_sync
from ddpjob_worker.replication.ledger import Entry, Ledger, Stat

pytestmark = pytest.mark.unit


def e(path: str, version: int = 1, origin: str = "w0", deleted: bool = False) -> Entry:
    return Entry(path=path, version=version, origin=origin, size=0 if deleted else 10, sha256="" if deleted else "s",
                 deleted=deleted)


def view(*entries: Entry) -> dict[str, Entry]:
    return {x.path: x for x in entries}


HF = ["model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state_0.pth", "trainer_state.json"]


def hf(step: int, files: list[str] = HF, origin: str = "w0") -> list[Entry]:
    return [e(f"hf/checkpoint-{step}/{f}", origin=origin) for f in files]


def test_ledger_versions_order_rewrites_and_deletions() -> None:
    a, b = Ledger("w0"), Ledger("w1")
    v1 = a.local_write("snapshot.pt", Stat(10, 1, 1), "s1")
    assert b.learn([v1], holder="a:1") == [v1], "w1 lacks it: fetch"
    b.received(v1, Stat(10, 5, 9))
    v2 = b.local_write("snapshot.pt", Stat(12, 6, 9), "s2")  # rank 0 moved to w1 and rewrote it
    assert v2.version == 2 and a.learn([v2], holder="b:1") == [v2]
    gone = a.local_delete("snapshot.pt")
    assert gone.version == 3 and gone.deleted
    assert b.learn([gone]) == [gone], "w1 holds v2, older than the deletion: delete it"
    assert a.learn([v1]) == [], "an old announcement changes nothing"


def test_ledger_ties_go_to_the_origin_name_on_every_pod() -> None:
    x, y = e("f", 4, "w0"), e("f", 4, "w1")
    a, b = Ledger("a"), Ledger("b")
    a.learn([x, y])
    b.learn([y, x])
    assert a.newest["f"] == b.newest["f"] == y


def test_ledger_holders() -> None:
    led = Ledger("w2")
    v = e("hf/checkpoint-5/model.safetensors")
    led.learn([v], holder="10.0.0.1:29401")
    led.learn([v], holder="10.0.0.2:29401")
    assert led.holders_of(v) == ["10.0.0.1:29401", "10.0.0.2:29401"]
    led.forget_holder("10.0.0.1:29401")
    assert led.holders_of(v) == ["10.0.0.2:29401"]


@pytest.mark.parametrize(("name", "newest", "partial", "required", "delete", "resume"), [
    pytest.param("hf: rank 0 killed writing checkpoint-150",
                 [*hf(50), *hf(100), *hf(150, ["model.safetensors"]), e("hf/checkpoint-150/rng_state_1.pth",
                                                                        origin="w1")],
                 ["hf/checkpoint-150/optimizer.pt"],
                 [f"hf/checkpoint-100/{f}" for f in sorted(HF)],
                 ["hf/checkpoint-150/model.safetensors", "hf/checkpoint-150/rng_state_1.pth"],
                 {"hf": "hf/checkpoint-100"}, id="hf-partial-newest"),
    pytest.param("dcp: the coordinator died before .metadata",
                 [e("dcp/step-10/__0_0.distcp"), e("dcp/step-10/__1_0.distcp", origin="w1"),
                  e("dcp/step-10/.metadata"), e("dcp/step-20/__1_0.distcp", origin="w1")],
                 [],
                 ["dcp/step-10/.metadata", "dcp/step-10/__0_0.distcp", "dcp/step-10/__1_0.distcp"],
                 ["dcp/step-20/__1_0.distcp"], {"dcp": "dcp/step-10"}, id="dcp-no-metadata"),
    pytest.param("tutorial: snapshot.pt cut on one pod, whole on another",
                 [e("snapshot.pt", 3, "w0")], ["snapshot.pt"], ["snapshot.pt"], [], {}, id="snapshot-rewritten"),
    pytest.param("a file only partial anywhere is set aside",
                 [e("last.ckpt", 2)], ["other.pt"], ["last.ckpt"], [], {}, id="partial-only"),
    pytest.param("lightning: numbered files and last.ckpt",
                 [e("l/epoch=0-step=50.ckpt"), e("l/epoch=0-step=100.ckpt"), e("l/last.ckpt", 2)], [],
                 ["l/epoch=0-step=100.ckpt", "l/last.ckpt"], [], {"l/epoch=#-step=#.ckpt": "l/epoch=0-step=100.ckpt"},
                 id="lightning"),
    pytest.param("deleted by the writer's rotation", [*hf(100), e("hf/checkpoint-50/optimizer.pt", 2, deleted=True)],
                 [], [f"hf/checkpoint-100/{f}" for f in sorted(HF)], [], {"hf": "hf/checkpoint-100"}, id="rotation"),
])
def test_plan_sync(name: str, newest: list[Entry], partial: list[str], required: list[str], delete: list[str],
                   resume: dict[str, str]) -> None:
    plan = plan_sync(view(*newest), partial)
    assert [x.path for x in plan.required] == required, name
    assert sorted(plan.delete) == delete, name
    assert {k.split("/")[0] if "/" in k else k: v for k, v in plan.resume.items()} == {
        k.split("/")[0] if "/" in k else k: v for k, v in resume.items()}, name


def test_the_object_store_restores_only_what_is_newer_than_every_pod() -> None:
    remote = {"hf/checkpoint-200": hf(200), "hf/checkpoint-50": hf(50)}
    plan = plan_sync(view(*hf(100)), [], remote)
    assert {x.path for x in plan.remote} == {f"hf/checkpoint-200/{f}" for f in HF}
    assert plan.required == [], "checkpoint-100 is older than the store's: nothing from the pods"
    plan = plan_sync(view(*hf(300)), [], remote)
    assert plan.remote == [] and plan.resume == {"hf/checkpoint-#": "hf/checkpoint-300"}
    plan = plan_sync(view(*hf(100)), [], {**remote, "hf/checkpoint-250": hf(250)})
    assert {x.path for x in plan.remote} == {f"hf/checkpoint-250/{f}" for f in HF}, "the newest only"
    plan = plan_sync({}, [], {"snapshot.pt": [e("snapshot.pt", 7)]})
    assert [x.path for x in plan.remote] == ["snapshot.pt"], "every pod fresh: the store's snapshot"


def test_checkpointer_folders_are_restored_only_when_no_pod_holds_one_as_new() -> None:
    remote = {"checkpointer:step-40": [e("step-40/state.pt"), e("step-40/COMPLETE.json")]}
    assert [x.path for x in plan_sync({}, [], remote, checkpointer=[]).remote] == ["step-40/state.pt",
                                                                                    "step-40/COMPLETE.json"]
    assert plan_sync({}, [], remote, checkpointer=["step-40"]).remote == []
    assert plan_sync({}, [], remote, checkpointer=["step-20"]).resume == {"checkpointer": "step-40"}

"""Replication of a script's checkpoint folder between pods (ddpjob_worker.replication), with real replicators on
localhost (their HTTP servers, their scans of real folders) and the group sync over a real c10d store: what is
copied, when, and what never is."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from ddpjob_worker.replication import groupsync, replicator
from ddpjob_worker.replication.replicator import Replicator

from tests.worker.helpers import store_client, wait_until

pytestmark = pytest.mark.torchrun  # threads, sockets and a c10d store, like the torchrun tests

torch = pytest.importorskip("torch")


class Pods:
    """Replicators of one job, each with its own folder (an emptyDir per pod)."""

    def __init__(self, base: Path, n: int, keep: int = 3, budget: int = 0) -> None:
        self.base, self.keep, self.budget = base, keep, budget
        self.reps: list[Replicator] = []
        self.addresses: list[str] = []
        for i in range(n):
            rep = self._start(i)
            self.reps.append(rep)
            self.addresses.append(rep.address)

    def _start(self, i: int) -> Replicator:
        root = self.base / f"pod{i}"
        root.mkdir(exist_ok=True)
        rep = Replicator(root, f"job-worker-{i}", "uid-1", lambda: list(self.addresses), keep=self.keep,
                         budget=self.budget, quiet=0.3)
        rep.start("127.0.0.1", 0)
        return rep

    def replace(self, i: int) -> None:
        """Pod ``i`` replaced: its agent gone with its emptyDir, a new pod of the same name with an empty one."""
        import shutil

        self.reps[i].stop()
        shutil.rmtree(self.root(i))
        self.reps[i] = self._start(i)
        self.addresses[i] = self.reps[i].address

    def root(self, i: int) -> Path:
        return self.reps[i].root

    def close(self) -> None:
        for rep in self.reps:
            rep.stop()


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[Pods]:
    p = Pods(tmp_path, 3, keep=2)
    try:
        yield p
    finally:
        p.close()


def save(path: Path, value: float, numel: int = 1000) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"w": torch.full((numel,), value)}, path)
    return path.read_bytes()


def hf_checkpoint(root: Path, step: int, ranks: int = 1) -> None:
    """What the Hugging Face Trainer's rank 0 writes (trainer_state.json last)."""
    d = root / "hf" / f"checkpoint-{step}"
    save(d / "model.pt", step)
    save(d / "optimizer.pt", -step)
    for r in range(ranks):
        save(d / f"rng_state_{r}.pth", r)
    (d / "trainer_state.json").write_text(f'{{"global_step": {step}}}')


def test_a_finished_write_reaches_every_other_pod_whole(pods: Pods) -> None:
    data = save(pods.root(0) / "snapshot.pt", 1.0)
    for copy in (pods.root(1) / "snapshot.pt", pods.root(2) / "snapshot.pt"):
        wait_until(copy.exists, 20, f"the copy {copy}")
        assert copy.read_bytes() == data
    rewritten = save(pods.root(0) / "snapshot.pt", 2.0)  # rewritten in place, as the tutorial does
    wait_until(lambda: (pods.root(2) / "snapshot.pt").read_bytes() == rewritten, 20, "the new version")
    assert not any(p.name.startswith(".") or "incoming" in p.parts for p in (pods.root(1)).rglob("*.pt"))


def test_a_file_open_for_writing_or_cut_is_never_copied(pods: Pods) -> None:
    data = save(pods.root(0) / "tmp.pt", 3.0, numel=200_000)
    with open(pods.root(0) / "open.pt", "wb") as f:  # a writer that is still at it
        f.write(data[: len(data) // 2])
        f.flush()
        time.sleep(2.5)
        assert not (pods.root(1) / "open.pt").exists(), "copied while its writer still had it open"
        f.write(data[len(data) // 2:])
    wait_until(lambda: (pods.root(1) / "open.pt").exists(), 20, "the copy once closed")
    assert (pods.root(1) / "open.pt").read_bytes() == data
    (pods.root(0) / "cut.pt").write_bytes(data[:-100])  # a torch.save killed before its end
    time.sleep(3)
    assert not (pods.root(1) / "cut.pt").exists(), "a partial write was copied"


def test_deletions_and_keep_follow_the_writer(pods: Pods) -> None:
    for step in (10, 20, 30):
        hf_checkpoint(pods.root(0), step)
    wait_until(lambda: (pods.root(2) / "hf/checkpoint-30/trainer_state.json").exists(), 30, "checkpoint-30")
    wait_until(lambda: not (pods.root(2) / "hf/checkpoint-10").exists(), 20, "keep=2 drops the oldest copy")
    assert (pods.root(0) / "hf/checkpoint-10").exists(), "the writer's own files are its own to rotate"
    import shutil

    shutil.rmtree(pods.root(0) / "hf/checkpoint-20")  # save_total_limit's rotation on rank 0
    wait_until(lambda: not (pods.root(1) / "hf/checkpoint-20").exists(), 20, "the deletion to reach the copies")


def sync_all(pods: Pods, master: object) -> list[groupsync.SyncPlan]:
    """Every pod's sync at once, each agent with its own connection to the round's store (as in pods)."""
    plans: list[groupsync.SyncPlan | Exception] = [Exception("not run")] * len(pods.reps)
    port = master.port  # type: ignore[attr-defined]

    def one(i: int) -> None:
        try:
            store = store_client(port, timedelta(seconds=30))
            plans[i] = groupsync.sync(pods.reps[i], store, i, len(pods.reps), timeout=30)
        except Exception as err:
            plans[i] = err

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(pods.reps))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for p in plans:
        if isinstance(p, Exception):
            raise p
    return plans  # type: ignore[return-value]


def tcp_store() -> object:
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    return TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False)


def test_the_group_sync_agrees_on_the_newest_complete_checkpoint(pods: Pods) -> None:
    """Rank 0 was killed writing checkpoint-30 (no trainer_state.json), after rank 1 wrote its RNG file into it;
    pod 2 is a replacement with an empty folder: after the sync every pod holds checkpoint-20, nothing of 30."""
    hf_checkpoint(pods.root(0), 20, ranks=2)
    wait_until(lambda: (pods.root(1) / "hf/checkpoint-20/trainer_state.json").exists(), 30, "checkpoint-20 copied")
    d = pods.root(0) / "hf/checkpoint-30"
    save(d / "model.pt", 30.0)
    (d / "optimizer.pt").write_bytes(save(d / "tmp.pt", 1.0, numel=100_000)[:5000])  # cut by the kill
    (d / "tmp.pt").unlink()
    save(pods.root(1) / "hf/checkpoint-30/rng_state_1.pth", 1.0)
    pods.replace(2)
    plans = sync_all(pods, tcp_store())
    assert {tuple(p.resume.values()) for p in plans} == {("hf/checkpoint-20",)}
    for i in range(3):
        root = pods.root(i)
        assert (root / "hf/checkpoint-20/trainer_state.json").exists(), f"pod {i} lacks checkpoint-20"
        assert (root / "hf/checkpoint-20/rng_state_1.pth").exists()
        assert not (root / "hf/checkpoint-30").exists(), f"pod {i} still shows the partial checkpoint-30"
    time.sleep(1.5)  # the background loops must not bring the set-aside files back
    assert not any((pods.root(i) / "hf/checkpoint-30").exists() for i in range(3))


def test_a_sync_that_cannot_get_a_file_names_it_and_the_pod(tmp_path: Path) -> None:
    p = Pods(tmp_path, 2)
    try:
        hf_checkpoint(p.root(0), 5)
        p.reps[0].scan_once(force=True)
        real = replicator.Replicator.bring
        replicator.Replicator.bring = lambda self, entry, holders=(): False  # type: ignore[method-assign]
        try:
            with pytest.raises(groupsync.SyncFailed, match=r"job-worker-1 could not get hf/checkpoint-5/\S+ "
                                                           r"\(held by job-worker-0\)"):
                sync_all(p, tcp_store())
        finally:
            replicator.Replicator.bring = real  # type: ignore[method-assign]
    finally:
        p.close()


def test_pods_that_share_one_volume_do_not_copy(tmp_path: Path) -> None:
    shared = tmp_path / "claim"
    shared.mkdir()
    addresses: list[str] = []
    reps = []
    for i in range(2):
        rep = Replicator(shared, f"w{i}", "uid", lambda: list(addresses), quiet=0.2)
        rep.start("127.0.0.1", 0)
        reps.append(rep)
        addresses.append(rep.address)
    try:
        save(shared / "a.pt", 1.0)
        time.sleep(2)
        incoming = list((shared / replicator.STATE_DIR / "incoming").iterdir())
        assert incoming == [] and os.listdir(shared / replicator.STATE_DIR).count("volume-id") == 1
        assert all(r.ledger.holders.get("a.pt", {}) == {} for r in reps)
    finally:
        for r in reps:
            r.stop()

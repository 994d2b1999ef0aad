"""The object-store tier (ddpjob_worker.replication.tier) against a real S3 server (SeaweedFS): complete checkpoints
are uploaded (never a partial one), the store keeps ``keep`` of each family, and a job whose pods all start fresh
gets the newest one back on every pod before its group starts, the Checkpointer's own folders included."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from ddpjob_worker.objectstore import ObjectStore, ObjectStoreConfig
from ddpjob_worker.replication import groupsync, scan, units
from ddpjob_worker.replication.replicator import Replicator
from ddpjob_worker.replication.tier import Tier

from tests.cluster.objectstore import S3Server, weed_binary
from tests.worker.helpers import store_client, wait_until
from tests.worker.test_replication import hf_checkpoint

pytestmark = [pytest.mark.objectstore, pytest.mark.xdist_group("objectstore")]

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    if not weed_binary().exists():
        pytest.skip(f"SeaweedFS's weed is not built ({weed_binary()}): run hack/install-tools.sh")
    # The oldest torch's venv (hack/compat.sh) holds no boto3: the tier moves files, torch's part is covered there
    # by tests/worker/test_replication.py.
    pytest.importorskip("boto3", reason="boto3 is not installed: the dev venv has it (pyproject's objectstore extra)")
    with S3Server.start(tmp_path_factory.mktemp("s3")) as s:
        yield s


class Job:
    """Pods of one job with replication and the tier, all started fresh on demand (every pod lost)."""

    def __init__(self, base: Path, server: S3Server, bucket: str, n: int = 2) -> None:
        self.base, self.server, self.bucket, self.n = base, server, bucket, n
        self.generation = 0
        self.pods: list[tuple[Replicator, Tier]] = []
        self.addresses: list[str] = []
        self.fresh()

    def store(self) -> ObjectStore:
        return ObjectStore(ObjectStoreConfig(endpoint=self.server.endpoint, bucket=self.bucket, prefix="ns/job/",
                                             access_key_id=self.server.access_key,
                                             secret_access_key=self.server.secret_key))

    def fresh(self) -> None:
        """Every pod lost: new pods with empty folders."""
        self.close()
        self.generation += 1
        self.pods, self.addresses = [], []
        for i in range(self.n):
            root = self.base / f"gen{self.generation}-pod{i}"
            root.mkdir()
            rep = Replicator(root, f"job-worker-{i}", "uid", lambda: list(self.addresses), keep=2, quiet=0.2)
            rep.start("127.0.0.1", 0)
            tier = Tier(rep, self.store())
            tier.start()
            self.pods.append((rep, tier))
            self.addresses.append(rep.address)

    def root(self, i: int) -> Path:
        return self.pods[i][0].root

    def sync(self) -> list[groupsync.SyncPlan]:
        from torch.distributed import TCPStore  # type: ignore[attr-defined]

        master = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=60), wait_for_workers=False)
        out: list[Any] = [None] * self.n

        def one(i: int) -> None:
            store = store_client(master.port, timedelta(seconds=60))
            try:
                out[i] = groupsync.sync(self.pods[i][0], store, i, self.n,
                                        remote=self.pods[i][1], timeout=60)
            except Exception as err:
                out[i] = err

        threads = [threading.Thread(target=one, args=(i,)) for i in range(self.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for r in out:
            if isinstance(r, Exception):
                raise r
        return out

    def close(self) -> None:
        for rep, _ in self.pods:
            rep.stop()


@pytest.fixture
def job(tmp_path: Path, server: S3Server) -> Iterator[Job]:
    j = Job(tmp_path, server, server.bucket(f"t-{uuid.uuid4().hex[:12]}"))
    try:
        yield j
    finally:
        j.close()


def records(job: Job) -> list[str]:
    return sorted(k for k in job.store().list_keys("units/"))


def test_complete_checkpoints_go_up_and_come_back_on_every_fresh_pod(job: Job) -> None:
    tier = job.pods[0][1]
    tier.uploading.set()  # this pod holds rank 0
    for step in (10, 20, 30):
        hf_checkpoint(job.root(0), step, ranks=2)
    partial = job.root(0) / "hf/checkpoint-40"
    partial.mkdir(parents=True)
    (partial / "model.pt").write_bytes(b"PK\x03\x04 cut")  # a save killed half-way
    wait_until(lambda: "units/hf%2Fcheckpoint-30.json" in records(job), 60, "checkpoint-30 uploaded")
    wait_until(lambda: "units/hf%2Fcheckpoint-10.json" not in records(job), 30, "keep=2 in the store")
    assert not any("checkpoint-40" in k for k in records(job)), "a partial checkpoint was uploaded"
    want = {p.relative_to(job.root(0)).as_posix(): scan.sha256_of(p)
            for p in (job.root(0) / "hf/checkpoint-30").iterdir()}
    job.fresh()  # every pod lost at once (a preemption, a node pool drained)
    plans = job.sync()
    assert all(p.resume.get("hf/checkpoint-#") == "hf/checkpoint-30" for p in plans), [p.resume for p in plans]
    for i in range(job.n):
        got = {p.relative_to(job.root(i)).as_posix(): scan.sha256_of(p)
               for p in (job.root(i) / "hf/checkpoint-30").iterdir()}
        assert got == want, f"pod {i} restored something else"


def test_the_checkpointers_folders_are_restored_only_where_no_pod_has_one(job: Job) -> None:
    """ddpjob_worker.checkpoint's step-N folders: uploaded at the agent's exit (its SIGTERM checkpoint), restored
    into a fresh job (every pod's volume), not replicated between pods (they have their own peer path)."""
    root = job.root(0)
    (root / units.CHECKPOINTER_VOLUME_ID).write_text("vol")
    step = root / "step-40"
    step.mkdir()
    torch.save({"w": torch.ones(10)}, step / "state.pt")
    (step / "COMPLETE.json").write_text('{"step": 40}')
    job.pods[1][1].flush(30)  # pod 1 has none: nothing to upload
    assert records(job) == []
    job.pods[0][1].flush(30)  # the agent's exit on pod 0
    assert records(job) == ["units/checkpointer%3Astep-40.json"]
    assert not (job.root(1) / "step-40").exists(), "the Checkpointer's folders are not replicated"
    job.fresh()
    plans = job.sync()
    assert all(p.resume.get("checkpointer") == "step-40" for p in plans)
    for i in range(job.n):
        assert (job.root(i) / "step-40/COMPLETE.json").read_text() == '{"step": 40}'

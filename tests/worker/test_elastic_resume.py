"""Issue 27: a world-size change mid-epoch resumes at the next unseen sample. Real torchrun agents of an elastic job
(nnodes 1:3) go 2 -> 3 -> 1 -> 2 within one epoch (an agent added, two agents stopped as a pod deletion stops them,
one added again); every rank records the sample indices of each step (tests/worker/scripts/elastic_samples.py)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.samples import committed, world_changes
from tests.samples import seen as consumed
from tests.worker.helpers import LocalJob, wait_exit, wait_until

pytestmark = pytest.mark.torchrun
SCRIPT = ["python", str(Path(__file__).parent / "scripts" / "elastic_samples.py")]
N, BATCH = 400, 2


def records(logs: Path) -> list[dict[str, Any]]:
    out = []
    for f in logs.glob("*.jsonl"):
        out += [json.loads(line) for line in f.read_text().splitlines() if line.endswith("}")]
    return out


def steps_with_world(logs: Path, world: int) -> int:
    return len({r["step"] for r in records(logs) if r["world"] == world})


@pytest.mark.timeout(420)
def test_world_size_changes_mid_epoch_see_every_sample_once(job: LocalJob) -> None:
    logs = job.workdir / "samples"
    logs.mkdir()
    env = {"nnodes": "1:3", "SAMPLES_LOG": str(logs), "SAMPLES_N": str(N), "SAMPLES_STEP_SECONDS": "0.15",
           "DDPJOB_WARM_TRAINERS": "0", "SAMPLES_OLD": os.environ.get("SAMPLES_OLD", "0")}
    first = [job.agent(i, SCRIPT, **env) for i in range(2)]
    wait_until(lambda: steps_with_world(logs, 2) >= 8, 150, "8 steps with 2 agents")
    third = job.agent(2, SCRIPT, **env)
    wait_until(lambda: steps_with_world(logs, 3) >= 8, 150, "8 steps with 3 agents")
    for agent in (first[1], third):  # two pods deleted: SIGTERM, as the kubelet sends it
        os.kill(agent.pid, signal.SIGTERM)
    for agent in (first[1], third):
        wait_exit(agent, 120, job)
    wait_until(lambda: steps_with_world(logs, 1) >= 8, 150, "8 steps with 1 agent")
    fourth = job.agent(3, SCRIPT, **env)
    for agent in (first[0], fourth):
        assert wait_exit(agent, 200, job) == 0, job.tails()
    recs = records(logs)
    kept = committed(recs)
    changes = world_changes(kept)
    assert changes[-4:] == [2, 3, 1, 2] or changes == [1, 2, 3, 1, 2], changes
    seen = consumed(kept)
    repeated = {i: c for i, c in seen.items() if c > 1}
    left_out = set(range(N)) - set(seen)
    assert not repeated, f"samples seen twice in one epoch: {sorted(repeated)[:20]}"
    assert len(left_out) < 2 * BATCH, f"samples never seen: {sorted(left_out)}"  # the dropped tail: < 1 round
    replayed = len(recs) - sum(len(rs) for rs in kept.values())
    print(f"world sizes {changes}; {len(kept)} steps, {sum(seen.values())} samples, {len(left_out)} dropped at the "
          f"epoch's end, {replayed} step records replayed after a change")

"""runtime/memory.kept: the DDPJob body the controller keeps between passes."""

from __future__ import annotations

import json

from ddpjob_operator.runtime.memory import kept

from .factories import make_job


def test_kept_bodies_share_their_keys_and_drop_managed_fields_only() -> None:
    job = make_job(replicas=2).obj()
    job["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    job["status"] = {"conditions": [{"type": "Running", "status": "True"}], "progress": {"globalStep": 3}}
    text = json.dumps(job)
    first, second = kept(json.loads(text)), kept(json.loads(text))
    assert "managedFields" not in first["metadata"]
    without = json.loads(text)
    del without["metadata"]["managedFields"]
    assert first == without, "nothing but managedFields is left out"
    for a, b in ((first, second), (first["status"]["conditions"][0], second["status"]["conditions"][0]),
                 (first["status"]["progress"], second["status"]["progress"])):
        assert all(x is y for x, y in zip(a, b, strict=True)), "each key one object in the process"
    original = json.loads(text)
    kept(original)
    assert "managedFields" in original["metadata"], "the body handed in is not changed"

"""What the operator remembers about one job between passes. All of it is rebuildable after a restart: losing it
costs at most a recount that the status (countedFailures, pod labels) makes idempotent."""

from __future__ import annotations

import dataclasses
import random
import sys
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ddpjob_operator.planner.observation import PodView
from ddpjob_operator.planner.policies import pod_verdicts
from ddpjob_operator.planner.policies.children import ChildKey, Problem

#: How long a pod we created may be missing from the watch-fed cache before we stop assuming it exists.
EXPECTATION_TTL = 30.0
#: Cap of the exponential retry backoff (seconds).
MAX_BACKOFF = 60.0


def kept(body: Mapping[str, Any]) -> dict[str, Any]:
    """The DDPJob body as kept between passes: without metadata.managedFields, the API server's field-ownership
    bookkeeping that nothing here reads and that outweighs the spec (one entry per writer: the submitter, every
    status write, the progress reporter), and with its keys shared with every other job's. A JSON decoder gives each
    document its own copy of each key: decoded, a DDPJob weighed ~5x its JSON (1,703 B -> 8,504 B, tracemalloc), with
    its keys shared ~3.4x (5,789 B); at 5,000 jobs the kept bodies were most of the operator's RSS
    (docs/operator-scale.md). Sharing them costs ~11 us a body."""
    meta = body.get("metadata") or {}
    if "managedFields" in meta:
        body = {**body, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return _shared_keys(body)  # type: ignore[no-any-return]


def _shared_keys(value: Any) -> Any:
    """``value`` rebuilt with every dict key interned (sys.intern: one copy per distinct key in the process)."""
    if isinstance(value, dict):
        return {sys.intern(k) if type(k) is str else k: _shared_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shared_keys(v) for v in value]
    return value


def backoff(attempt: int, base: float = 0.5) -> float:
    """Exponential backoff with full jitter in its upper half: many jobs refused at once (a quota, an API outage)
    do not retry in lockstep."""
    ceiling = min(MAX_BACKOFF, base * 2 ** max(0, attempt))
    return float(ceiling / 2 + random.uniform(0, ceiling / 2))


@dataclasses.dataclass
class JobMemory:
    """One job's memory in this operator process."""

    body: dict[str, Any]
    resource_version: str = ""
    """The body's resourceVersion (status_write.older says when one is older)."""
    touched: int = 0
    """The controller's event count when a watch event or our own write last changed ``body``."""
    restarts_floor: int = 0
    incidents_floor: int = 0
    expected: dict[str, tuple[PodView, float]] = dataclasses.field(default_factory=dict)
    """Pods we created that the cache has not shown yet, by name."""
    gone_uids: set[str] = dataclasses.field(default_factory=set)
    """Pods we force-deleted: absent at once, whatever the cache still shows."""
    deleted_uids: set[str] = dataclasses.field(default_factory=set)
    """Every pod we deleted: its tombstone is our own doing, not a loss."""
    problems: dict[ChildKey, Problem] = dataclasses.field(default_factory=dict)
    """The API server's last answer to a create that did not succeed (conflicts, refusals)."""
    name_taken: bool = False
    """A create of this pass found the name taken (409)."""
    refusals: int = 0
    """Consecutive passes with a refused create (for the retry backoff)."""
    errors: int = 0
    passes: int = 0
    """Passes completed by this process (0: the first, which may find pods lost while the operator was down)."""
    priority: tuple[str, int | None] | None = None
    """Kueue: the job's WorkloadPriorityClass as last read (name, value; None: it does not exist)."""
    flavors: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    """Kueue: the ResourceFlavors of the job's current admission (read once per admission)."""
    routine_since: datetime | None = None
    """When a pass first held back a routine status change that is not written yet (status_writes)."""
    last_valid_spec: dict[str, Any] | None = None
    """The job's last spec that parsed (a running job goes on with it after an invalid edit)."""
    checkpoints_seen: dict[str, object] = dataclasses.field(default_factory=dict)
    """The checkpoint write and load already in the metrics (metrics.observe_checkpoints)."""
    unreadable_said: set[str] = dataclasses.field(default_factory=set)
    """Paths of status.progress times already said to be unreadable (an Event and a log line once per job)."""
    pods_accepted: set[str] = dataclasses.field(default_factory=set)
    """Specs (pod_verdicts.spec_key) whose dry-run pods the API server accepted (runtime/pod_check.py)."""
    pods_refused: dict[str, pod_verdicts.Verdict] = dataclasses.field(default_factory=dict)
    """Specs whose dry-run pods the pod API refused as invalid, with why in the spec's terms."""

    def take(self, body: dict[str, Any], resource_version: str, events: int) -> None:
        """``body`` is the newest version now."""
        self.body, self.resource_version, self.touched = body, resource_version, events

    def observed_pods(self, cached: list[PodView], now: float) -> list[PodView]:
        """The cache's pods, plus pods we created that it has not delivered yet, minus pods we force-deleted and
        tombstones of our own deletions."""
        pods = [p for p in cached if p.uid not in self.gone_uids and not (p.gone and p.uid in self.deleted_uids)]
        by_name = {p.name: p for p in pods if not p.gone}
        for name, (view, at) in list(self.expected.items()):
            seen = by_name.get(name)
            if (seen is not None and seen.uid == view.uid) or now - at > EXPECTATION_TTL:
                del self.expected[name]
            elif seen is None:
                pods.append(view)
        live = {p.uid for p in cached}
        self.gone_uids &= live
        self.deleted_uids &= live
        return pods

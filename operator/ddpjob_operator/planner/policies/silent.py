"""Silent pods: workers their own group removed from its rendezvous round because they stopped beating (a
powered-off or cut-off node, a frozen pod), reported in ``status.progress.lostPeers`` by the agent that removed
them (ddpjob_worker.peerreport), within spec.rendezvous.peerTimeoutSeconds of the silence.

Kubernetes says the same 15-40 s later (the node NotReady), and the pod's name stays taken until its
force deletion (terminatingNodeTimeoutSeconds after that): a job without a spare waited for all of it. Here such
a pod is a loss at once (cause NodeLost, its time the start of the silence, so the incident's recovery clock
starts there) and, once counted, it is force-deleted and created again at its index in the same pass. The old
pod, if its node is only cut off, runs on until its kubelet is back and learns the pod is gone; its trainers
were already out of the group, and fencing keeps its checkpoint writes out (docs/checkpoints.md).

A report names the pod's UID (the agent's rendezvous node carries it, ddpjob_worker.peerreport) and applies to that
pod only, never to a pod of the same name started since, such as the replacement of a pod deleted on purpose whose
agent was killed at the end of its grace period and found silent seconds after that replacement was created. No
time decides it: ``silentSince`` is the reporting worker's clock, and comparing it with a pod's start (another
node's clock) let a reporter whose clock ran ahead force-delete each new replacement. A report without a UID (a
runtime older than the operator) is not acted on: Kubernetes' NotReady path replaces that pod.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ddpjob_operator.api.formats import parse_time
from ddpjob_operator.api.reasons import NODE_LOST
from ddpjob_operator.planner.observation import PodView
from ddpjob_operator.planner.policies.failure import Loss


@dataclasses.dataclass(frozen=True, slots=True)
class Report:
    """One pod reported silent by its group."""

    since: datetime
    """When its last beat was seen (the reporter's clock: the incident's start, never compared with a pod's)."""
    reported: datetime
    by: str
    """The pod whose agent removed it."""
    uid: str = ""
    """The silent pod's UID ("" from an older runtime: the report is then not acted on)."""


def reports(progress: Mapping[str, Any] | None) -> dict[str, Report]:
    """The reports in status.progress.lostPeers, by pod name (malformed entries are skipped)."""
    out: dict[str, Report] = {}
    for pod, entry in ((progress or {}).get("lostPeers") or {}).items():
        if not isinstance(entry, Mapping):
            continue
        try:  # written by workers: a malformed entry must never stop the planner
            since, reported = parse_time(entry.get("silentSince")), parse_time(entry.get("reportTime"))
        except (TypeError, ValueError, AttributeError):
            continue
        if since is not None and reported is not None:
            out[str(pod)] = Report(since, reported, str(entry.get("by") or "a peer"), str(entry.get("uid") or ""))
    return out


def applies(pod: PodView, report: Report | None) -> bool:
    """Whether ``report`` is about this very pod (its UID), still a live worker."""
    if report is None or not report.uid or pod.terminated or pod.deleting or pod.gone:
        return False
    return report.uid == pod.uid


def loss(pod: PodView, report: Report | None, node_ready: Mapping[str, bool]) -> Loss | None:
    """The loss a reported pod represents, or None when the report is not about it."""
    if report is None or not applies(pod, report):
        return None
    silent = max(0.0, (report.reported - report.since).total_seconds())
    if pod.node_name:
        ready = "Ready" if node_ready.get(pod.node_name) is True else "NotReady"
        where = f"its node {pod.node_name} is {ready} to Kubernetes so far"
    else:
        where = "it had no node"
    return Loss(pod.name, pod.uid, pod.index, NODE_LOST, report.since,
                f"silent to its group for {silent:.1f} s (spec.rendezvous.peerTimeoutSeconds): {report.by} removed it "
                f"from the training group; {where}")

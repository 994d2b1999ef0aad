"""Stuck pods: a pod Terminating on a NotReady node never finishes deleting (the kubelet that would confirm
it is gone), which left other operators' jobs Restarting forever (kubeflow/trainer#2072). Past a threshold
the operator force-deletes it and replaces the worker."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from ddpjob_operator.planner.observation import PodView


def is_stuck_terminating(pod: PodView, node_ready: Mapping[str, bool], timeout_seconds: int, now: datetime) -> bool:
    """True for a pod Terminating (since its deletion was requested) for longer than ``timeout_seconds`` on a node
    known to be NotReady
    (a node missing from ``node_ready`` is treated as NotReady: a deleted node confirms nothing either)."""
    if pod.deletion_timestamp is None or not pod.node_name:
        return False
    if node_ready.get(pod.node_name, False):
        return False
    # From the deletion request, not the deletionTimestamp (request + grace period): a kubelet that cannot be
    # reached uses no grace period, and counting it would add it (45 s in the e2e jobs) to every node loss.
    requested = pod.deletion_requested or pod.deletion_timestamp
    return now - requested >= timedelta(seconds=timeout_seconds)


def stuck_check_at(pod: PodView, timeout_seconds: int) -> datetime | None:
    """When a Terminating pod should be looked at again (for the planner's requeue)."""
    if pod.deletion_requested is None:
        return None
    return pod.deletion_requested + timedelta(seconds=timeout_seconds)

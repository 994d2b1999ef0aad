"""Reads the chart's worker admission policy and its binding at start and every resync period, and says what it
found (planner/policies/isolation.py): in ddpjob_worker_admission_policy{state}, in a log line whenever it changes
(a warning while it is not in force), and on every job through the controller's next passes (condition
StatusUnprotected and its Event)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import kopf

from ddpjob_operator.kube.client import Kube
from ddpjob_operator.kube.kopf_compat import kopf_errors
from ddpjob_operator.metrics import registry as metrics
from ddpjob_operator.planner.policies import isolation

log = logging.getLogger("ddpjob.isolation")

API = "admissionregistration.k8s.io/v1"
#: How soon a check that could not read the objects is tried again (a 5xx, a connection lost at start).
RETRY_SECONDS = 10.0


class IsolationCheck:
    """The last verdict on the policy named ``policy`` (empty: not checked)."""

    def __init__(self, policy: str = "") -> None:
        self.policy = policy
        self.verdict: isolation.Verdict | None = None

    async def read(self, kube: Kube) -> isolation.Verdict:
        """Read the policy and its binding (same name) and judge them."""
        if not self.policy:
            return isolation.judge("", None, None)
        try:
            policy = await kube.get_cluster_scoped(API, "validatingadmissionpolicies", self.policy)
            binding = await kube.get_cluster_scoped(API, "validatingadmissionpolicybindings", self.policy)
        except (kopf_errors.APIError, kopf.TemporaryError) as err:
            return isolation.judge(self.policy, None, None, error=str(err) or type(err).__name__)
        return isolation.judge(self.policy, policy, binding)

    async def refresh(self, kube: Kube) -> bool:
        """Check once; True when the verdict changed."""
        verdict = await self.read(kube)
        changed = verdict != self.verdict
        self.verdict = verdict
        metrics.set_worker_admission_policy(verdict.state)
        if changed:
            level = logging.INFO if verdict.state in (isolation.PRESENT, isolation.UNCHECKED) else logging.WARNING
            log.log(level, "worker admission policy %s: %s", verdict.state, verdict.message)
        return changed

    async def run(self, kube: Kube, period: float, changed: Callable[[], Any]) -> None:
        """Check at once, then every ``period`` seconds (sooner while it cannot read them); ``changed`` is called
        when the verdict changes (the controller passes every job again)."""
        while True:
            try:
                if await self.refresh(kube):
                    changed()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # a check must never take the operator down
                log.warning("worker admission policy check failed: %r", err)
            unknown = self.verdict is None or self.verdict.state == isolation.UNKNOWN
            if not self.policy or (period <= 0 and not unknown):
                return
            await asyncio.sleep(min(period, RETRY_SECONDS) if unknown or period <= 0 else period)

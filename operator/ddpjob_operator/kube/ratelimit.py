"""The operator's client-side rate limit (issue 23 #7): a token bucket in front of every API request, as
Kubernetes' own controllers have (client-go's QPS and burst, ``--kube-api-qps``/``--kube-api-burst``).

``burst`` requests may go at once; after that, ``qps`` per second. A request over the limit waits for its turn
rather than being dropped: the bucket goes negative by the requests already promised a slot, so waiters are
served in order and the average never exceeds ``qps``. The limits come from ``ddpjob operator --api-qps
--api-burst`` (chart values ``apiRateLimit.qps`` and ``.burst``); qps 0 turns the limit off."""

from __future__ import annotations

import asyncio
import dataclasses
import time

#: Defaults: above what the operator reached at its 500-job benchmark (230 requests/s, controller.py), so the
#: limit never slows a healthy burst here; a platform team lowers them for a shared API server.
DEFAULT_QPS = 300.0
DEFAULT_BURST = 600

_configured: tuple[float, int] = (DEFAULT_QPS, DEFAULT_BURST)


def configure(qps: float, burst: int) -> None:
    """Set the operator-wide limits (``ddpjob operator --api-qps --api-burst``), for buckets made afterwards."""
    if qps < 0 or burst < 1:
        raise ValueError(f"--api-qps must be >= 0 and --api-burst >= 1 (got {qps} and {burst})")
    global _configured
    _configured = (qps, burst)


@dataclasses.dataclass(slots=True)
class TokenBucket:
    """``burst`` tokens, refilled at ``qps`` per second; each request takes one."""

    qps: float
    burst: int
    _tokens: float = 0.0
    _stamp: float | None = None

    def reserve(self, now: float) -> float:
        """Take a token at ``now``: the seconds to wait before the request may go (0 when one was free)."""
        if self.qps <= 0:
            return 0.0
        if self._stamp is None:
            self._tokens, self._stamp = float(self.burst), now
        self._tokens = min(float(self.burst), self._tokens + max(0.0, now - self._stamp) * self.qps) - 1
        self._stamp = now
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    async def acquire(self) -> None:
        """Wait for this request's turn."""
        delay = self.reserve(time.monotonic())
        if delay > 0:
            await asyncio.sleep(delay)


def bucket() -> TokenBucket:
    """A bucket with the configured limits (one per API client)."""
    qps, burst = _configured
    return TokenBucket(qps, burst)

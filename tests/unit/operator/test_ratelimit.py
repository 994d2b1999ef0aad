"""The operator's token bucket: burst at once, then qps per second, waiters in order; qps 0 is no limit."""

from __future__ import annotations

import pytest
from ddpjob_operator.kube import ratelimit
from ddpjob_operator.kube.ratelimit import TokenBucket


@pytest.mark.parametrize(("qps", "burst", "requests", "waits"), [
    # (time of each request) -> seconds each must wait
    (10, 3, [0, 0, 0, 0, 0], [0, 0, 0, 0.1, 0.2]),  # a burst of 3, then one per 0.1 s, in order
    (10, 3, [0, 0, 0, 1.0], [0, 0, 0, 0]),  # refilled (up to the burst) while idle
    (10, 3, [0, 0, 0, 0.05], [0, 0, 0, 0.05]),  # half a token back after 0.05 s
    (2, 1, [0, 0, 0], [0, 0.5, 1.0]),
    (0, 1, [0] * 50, [0] * 50),  # qps 0: off
])
def test_waits(qps: float, burst: int, requests: list[float], waits: list[float]) -> None:
    b = TokenBucket(qps, burst)
    assert [round(b.reserve(t), 6) for t in requests] == waits


def test_the_average_never_exceeds_qps() -> None:
    b = TokenBucket(50, 10)
    last = max(t + b.reserve(t) for t in [i * 0.001 for i in range(1000)])  # 1000 requests within one second
    assert last == pytest.approx((1000 - 10) / 50)


def test_configure_refuses_nonsense_and_new_buckets_take_the_limits() -> None:
    with pytest.raises(ValueError, match="--api-qps"):
        ratelimit.configure(-1, 5)
    with pytest.raises(ValueError, match="--api-burst"):
        ratelimit.configure(5, 0)
    try:
        ratelimit.configure(7, 9)
        assert (ratelimit.bucket().qps, ratelimit.bucket().burst) == (7, 9)
    finally:
        ratelimit.configure(ratelimit.DEFAULT_QPS, ratelimit.DEFAULT_BURST)


@pytest.mark.parametrize(("url", "resource"), [
    ("/api/v1/namespaces/ns/pods?fieldManager=ddpjob", "pods"),
    ("/api/v1/namespaces/ns/pods/job-worker-0", "pods"),
    ("/apis/ddpjob.io/v1alpha1/namespaces/ns/ddpjobs/job/status", "ddpjobs/status"),
    ("/apis/ddpjob.io/v1alpha1/ddpjobs?limit=500", "ddpjobs"),
    ("/api/v1/nodes/node-1", "nodes"),
    ("/apis/kueue.x-k8s.io/v1beta1/namespaces/a/workloads/w/status", "workloads/status"),
])
def test_the_request_metric_names_the_resource(url: str, resource: str) -> None:
    from ddpjob_operator.kube.client import _resource

    assert _resource(url) == resource

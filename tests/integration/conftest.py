"""Fixtures for operator integration tests: the CRD installed once, a real operator process per test."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.conftest import Cluster, wait_for
from tests.integration.kueue_support import Kueue
from tests.integration.operator_support import CRD_PATH, Jobs, OperatorProcess, Pool


@pytest.fixture(scope="session")
def ddpjob_crd(cluster: Cluster) -> str:
    """Install (or update) the DDPJob CRD and wait until the API server serves it."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_PATH))
    name = "ddpjobs.ddpjob.io"

    def established() -> bool:
        crd = json.loads(cluster.kubectl("get", "crd", name, "-o", "json").stdout)
        ok = any(c["type"] == "Established" and c["status"] == "True" for c in crd["status"].get("conditions", []))
        return ok and cluster.kubectl("get", "ddpjobs", "-A", check=False).returncode == 0

    wait_for(established, timeout=60, describe=f"CRD {name} established and served")
    return name


@pytest.fixture
def operator(cluster: Cluster, namespace: str, ddpjob_crd: str, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[OperatorProcess]:
    """`ddpjob operator` watching only this test's namespace; stopped (and its log shown on failure) after."""
    op = OperatorProcess(cluster, namespace, tmp_path_factory.mktemp("operator"))
    op.start()
    try:
        yield op
    finally:
        op.stop()


@pytest.fixture
def jobs(cluster: Cluster, namespace: str) -> Jobs:
    return Jobs(cluster, namespace)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """On failure, attach the operator's log tail: the first thing anyone debugging will ask for."""
    outcome = yield
    report = outcome.get_result()
    op = getattr(item, "funcargs", {}).get("operator")
    if report.failed and isinstance(op, OperatorProcess):
        report.sections.append(("operator log (tail)", op.tail(120)))


@pytest.fixture
def pool(cluster: Cluster, namespace: str) -> Iterator[Pool]:
    """kwok nodes only this test's pods may use (tainted and labelled with the namespace), deleted after it."""
    p = Pool(cluster, namespace)
    try:
        yield p
    finally:
        p.delete()


@pytest.fixture
def kq(cluster: Cluster, namespace: str) -> Iterator[Kueue]:
    k = Kueue(cluster, namespace)
    try:
        yield k
    finally:
        k.delete()

"""e2e fixtures: the session `cluster` is any live KUBECONFIG, else a local control plane *with a real node*
(tests/cluster/node.py), so e2e tests run real containers; helpers to target that node from any cluster."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cluster, live_kubeconfig
from tests.e2e.hostcheck import HostSnapshot

REAL_NODE_LABEL = "ddpjob.io/real-node"
#: Real nodes of the session's own cluster: node 0 for the operator and the runs that fault no node, two lanes
#: of three for the node-fault tests (tests/e2e/test_nodes.py: two workers on two nodes, a third for the
#: replacement), so two of them run at once (tests/e2e/background.py), and node 7 for the operator's second
#: replica (a drain of the leader's node then leaves the standby running: tests/e2e/test_soak.py).
E2E_NODES = int(os.environ.get("DDPJOB_E2E_NODES", "8"))


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Overrides tests/conftest.py's fixture for e2e: without a live KUBECONFIG, start the local cluster with
    real_node=True, and after `down` fail the session if anything of it is left on the host."""
    given = live_kubeconfig()
    if given is not None:
        yield Cluster(given)
        return
    from tests.cluster.controlplane import down, up

    directory = tmp_path_factory.mktemp("cluster")
    before = HostSnapshot.take(directory)
    try:
        state = up(directory, real_node=True, nodes=E2E_NODES)
    except Exception as err:
        pytest.fail(f"could not start the local cluster with a real node: {err}", pytrace=False)
    try:
        yield Cluster(state.kubeconfig)
    finally:
        down(directory, quiet=True)
        left = HostSnapshot.take(directory).left_since(before)
        assert not left, f"the real node left things behind after down: {left}"


def real_node_selector(cluster: Cluster) -> dict[str, str]:
    """nodeSelector for pods that must really run: the local real node when the cluster has one; on another
    cluster (kind) every node is real, so none."""
    nodes = json.loads(cluster.kubectl("get", "nodes", "-l", f"{REAL_NODE_LABEL}=true", "-o", "json").stdout)
    return {REAL_NODE_LABEL: "true"} if nodes["items"] else {}


@pytest.fixture(scope="session")
def env(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Any]:
    """Images on the node (local real node only), the operator installed with Helm and Ready: shared by every
    training module (one install, one reference run)."""
    from tests.e2e import training as t
    from tests.e2e.runs import Env

    given = os.environ.get("KUBECONFIG")
    cluster_dir = Path(cluster.kubeconfig).resolve().parent
    local_node = (cluster_dir / "node" / "state.json").exists()
    images = [*t.NODE_IMAGES, t.PLAIN_IMAGE]
    # The frameworks image (5.9 GB) only where a selected run uses it: `make e2e` has none (marker `extended`).
    if any(item.get_closest_marker("extended") for item in request.session.items):
        images.append(t.FRAMEWORKS_IMAGE)
    if given and Path(given).resolve() == Path(cluster.kubeconfig).resolve() and not os.environ.get(
            "DDPJOB_E2E_IMPORT"):
        t.log(f"KUBECONFIG={given} was given: not importing images; the cluster must already have {images} "
              "(kind: `kind load docker-image ...`; local real node: `make node-import` or DDPJOB_E2E_IMPORT=1)")
    elif local_node:
        missing = [i for i in images if subprocess.run(["docker", "image", "inspect", i], capture_output=True,
                                                       check=False).returncode != 0]
        if missing:
            pytest.fail(f"{missing} not built: run `bash hack/images.sh --e2e` (hack/e2e.sh does)")
        t.import_images(cluster_dir, images)
    else:
        pytest.fail(f"no KUBECONFIG given and {cluster_dir} has no real node to import images into")
    t.helm_install_operator(cluster, operator_affinity(cluster))
    try:
        yield Env(cluster, real_node_selector(cluster))
    finally:
        t.helm_uninstall_operator(cluster)


def operator_affinity(cluster: Cluster) -> dict[str, Any] | None:
    """Where the operator's two replicas run: off the nodes that tests take down (nodes 1.. of the local cluster),
    on node 0 and, where the cluster has one, a spare fault node no lane uses, one replica on each (required:
    nothing rolls the operator out in a session, which a third node would need). None on another cluster."""
    from tests.e2e.background import spare_nodes

    node0 = cluster.kubectl("get", "nodes", "-l", f"{REAL_NODE_LABEL}-index=0", "-o", "name").stdout.strip()
    if not node0:
        return None
    hosts = [node0.removeprefix("node/"), *spare_nodes(cluster)[:1]]
    affinity: dict[str, Any] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": hosts}]}]}}}
    if len(hosts) > 1:
        affinity["podAntiAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "topologyKey": "kubernetes.io/hostname",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "operator"}}}]}
    return affinity


def _reference_run(env: Any) -> Any:
    """The uninterrupted run every faulted run is compared with."""
    from tests.e2e import results
    from tests.e2e.runs import run_job

    run = run_job(env, "uninterrupted")
    results.record("uninterrupted", wall_seconds=round(run.wall_seconds, 1), params=run.params_sha256[:16],
                   incidents=run.status.get("incidentCount", 0))
    return run


@pytest.fixture(scope="session")
def background(env: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """The background runs (tests/e2e/background.py) of every selected test, started now, together."""
    from tests.e2e.background import RUNS, Background, lanes, pinned

    RUNS.setdefault("reference", _reference_run)
    items = request.session.items
    names = {m.args[0] for item in items for m in item.iter_markers("background")}
    if any("reference" in getattr(item, "fixturenames", ()) for item in items):
        names.add("reference")
    runs = Background(pinned(env), names, lanes(env))
    try:
        yield runs
    finally:
        runs.close()


class _Later:
    """A background run's result that a test waits for only when it first reads it: a test starts its own job,
    and compares it with the reference once that job is done."""

    def __init__(self, background: Any, name: str) -> None:
        self._background, self._name = background, name

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._background.result(self._name), attr)


@pytest.fixture(scope="session")
def reference(background: Any) -> Any:
    """The uninterrupted run every faulted run is compared with (a background run, started first; read lazily)."""
    return _Later(background, "reference")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The training runs' wall and recovery times (tests/e2e/test_training.py), whatever the outcome."""
    from tests.e2e.results import summary_lines

    for line in summary_lines():
        terminalreporter.write_line(line)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """test_up_down_leaves_nothing and tests marked ``own_real_nodes`` (clusters of their own) first, whatever the
    file names: they need the machine's real-node slot, which
    the session cluster holds from the first test that uses it until the end. Tests marked ``exclusive`` last:
    they wait for the background runs to end and must come after every foreground fault (test_spares.py counts
    recoveries in the operator's /metrics, which every other job's recovery would add to). Tests marked
    ``uninstalls`` after those: they remove the session's operator and CRD (tests/e2e/test_install.py)."""
    items.sort(key=lambda item: (item.name != "test_up_down_leaves_nothing"
                                 and item.get_closest_marker("own_real_nodes") is None,
                                 item.get_closest_marker("uninstalls") is not None,
                                 item.get_closest_marker("exclusive") is not None))


@pytest.fixture(scope="session", autouse=True)
def _object_store_server() -> Iterator[None]:
    """Stops the session's S3 server (tests/e2e/objectstores.py) if a run started it."""
    yield
    from tests.e2e import objectstores

    objectstores.stop()


def pytest_configure(config: pytest.Config) -> None:
    # Registered here, not in pyproject.toml (which the images copy: a change there rebuilds them all).
    config.addinivalue_line("markers", "own_real_nodes: starts real-node clusters of its own, not the session's "
                            "(runs first, while the machine's one real-node slot is free)")
    config.addinivalue_line("markers", "extended: an e2e run beyond the default tier (users' frameworks, the object "
                            "store): `make e2e-extended` runs them, `make e2e` and CI leave them out")

"""The chart and manifests/install.yaml against the real API server: install, upgrade, uninstall, RBAC.

kwok nodes run no containers, so these tests check what the API server accepts and grants; whether the
image really starts is checked by tests/images (Docker).
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from ddpjob_operator.api.names import WORKER_SERVICE_ACCOUNT as WORKER_SA
from ddpjob_operator.api.spec import parse_ddpjob
from ddpjob_operator.planner.children.builders import build_service, build_worker_identity, owner_reference
from ddpjob_worker.progress import ApiError, InClusterApi

from tests.conftest import Cluster, wait_for
from tests.integration.helm import ADOPT_CRD, CHART, CRD, RELEASE, Helm

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "manifests" / "install.yaml"
EXAMPLES = REPO / "manifests" / "examples"


@pytest.fixture
def helm(cluster: Cluster) -> Helm:
    return Helm(cluster)


@pytest.fixture
def other_namespace(cluster: Cluster) -> Iterator[str]:
    """A second fresh namespace: where a cluster-wide operator must also reach, or a watched one."""
    name = f"t-pkg-other-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def release(helm: Helm, namespace: str) -> Iterator[str]:
    """The chart installed with defaults (cluster-wide mode) into this test's namespace; uninstalled after."""
    helm("install", RELEASE, str(CHART), "--namespace", namespace, "--set", "image.tag=dev", *ADOPT_CRD)
    yield namespace
    helm("uninstall", RELEASE, "--namespace", namespace, "--wait", check=False)


def get_json(cluster: Cluster, *args: str) -> dict[str, object]:
    return dict(json.loads(cluster.kubectl("get", *args, "-o", "json").stdout))


def exists(cluster: Cluster, *args: str) -> bool:
    return cluster.kubectl("get", *args, check=False).returncode == 0


def crd_established(cluster: Cluster) -> bool:
    crd = json.loads(cluster.kubectl("get", "crd", CRD, "-o", "json").stdout)
    return any(c["type"] == "Established" and c["status"] == "True" for c in crd["status"]["conditions"])


def can(cluster: Cluster, sa: str, verb: str, resource: str, *scope: str) -> bool:
    """`kubectl auth can-i` as ``sa`` (a ServiceAccount or a user; exit 0: yes, 1: no). `pods/exec` means the
    subresource (kubectl itself would read it as a pod named "exec")."""
    resource, _, sub = resource.partition("/")
    subresource = [f"--subresource={sub}"] if sub else []
    proc = cluster.kubectl("auth", "can-i", verb, resource, *subresource, f"--as={sa}", *scope, check=False)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode == 0


def test_helm_lint_is_clean(helm: Helm) -> None:
    for extra in ([], ["--set", "watchNamespaces={team-a}"], ["--set", "metrics.serviceMonitor.enabled=true"]):
        out = helm("lint", "--strict", str(CHART), *extra).stdout
        assert "0 chart(s) failed" in out and "[WARNING]" not in out and "[ERROR]" not in out, out


def test_helm_install_upgrade_uninstall(cluster: Cluster, helm: Helm, namespace: str, other_namespace: str) -> None:
    cluster_role = f"{namespace}-{RELEASE}"
    out = helm("install", RELEASE, str(CHART), "--namespace", namespace, "--set", "image.tag=dev", *ADOPT_CRD).stdout
    assert f"kubectl -n {namespace} rollout status deployment/{RELEASE}" in out, "NOTES.txt names the next step"

    wait_for(lambda: crd_established(cluster), timeout=60, describe=f"CRD {CRD} established")
    for kind in ("deployment", "serviceaccount", "service"):
        assert exists(cluster, kind, RELEASE if kind != "service" else f"{RELEASE}-metrics", "-n", namespace)
    assert exists(cluster, "clusterrole", cluster_role) and exists(cluster, "clusterrolebinding", cluster_role)
    assert exists(cluster, "clusterrole", f"{cluster_role}-cluster-read")
    # kwok runs no container but does schedule and "start" the pod, so the rollout completes.
    rollout = cluster.kubectl("rollout", "status", f"deployment/{RELEASE}", "-n", namespace, "--timeout=120s",
                              check=False)
    # Seen once in a full run (not reproduced alone): keep what the cluster looked like in the failure.
    assert rollout.returncode == 0, (
        f"rollout did not complete: {rollout.stderr}\n"
        + cluster.kubectl("get", "pods,replicasets,events", "-n", namespace, "-o", "wide", check=False).stdout
        + cluster.kubectl("get", "nodes", "-o", "wide", check=False).stdout
    )

    # Upgrade to namespaced mode: the cluster-wide role goes, a Role appears in the watched namespace.
    helm("upgrade", RELEASE, str(CHART), "--namespace", namespace, "--reuse-values", "--wait", "--timeout=120s",
         "--set", f"watchNamespaces={{{other_namespace}}}", "--set", "resources.limits.memory=256Mi")
    assert not exists(cluster, "clusterrole", cluster_role)
    assert exists(cluster, "role", RELEASE, "-n", other_namespace)
    assert exists(cluster, "rolebinding", RELEASE, "-n", other_namespace)
    dep = get_json(cluster, "deployment", RELEASE, "-n", namespace)
    c = dep["spec"]["template"]["spec"]["containers"][0]  # type: ignore[index]
    assert f"--namespace={other_namespace}" in c["args"]
    assert c["resources"]["limits"]["memory"] == "256Mi"
    assert json.loads(helm("status", RELEASE, "--namespace", namespace, "-o", "json").stdout)["version"] == 2

    helm("uninstall", RELEASE, "--namespace", namespace, "--wait", "--timeout=120s")
    wait_for(lambda: not exists(cluster, "deployment", RELEASE, "-n", namespace), timeout=60,
             describe="Deployment removed by helm uninstall")
    for args in (["serviceaccount", RELEASE, "-n", namespace], ["role", RELEASE, "-n", other_namespace],
                 ["clusterrole", f"{cluster_role}-cluster-read"], ["service", f"{RELEASE}-metrics", "-n", namespace]):
        assert not exists(cluster, *args), args
    # The CRD is kept (helm.sh/resource-policy: keep; deleting it would delete every DDPJob): the API stays served.
    assert exists(cluster, "crd", CRD)


def test_rbac_cluster_wide_is_least_privilege(cluster: Cluster, release: str, other_namespace: str) -> None:
    sa = f"system:serviceaccount:{release}:{RELEASE}"
    anywhere = ["--all-namespaces"]
    elsewhere = ["-n", other_namespace]
    allowed = [
        ("list", "ddpjobs.ddpjob.io", anywhere), ("watch", "ddpjobs.ddpjob.io", anywhere),
        ("delete", "ddpjobs.ddpjob.io", elsewhere), ("patch", "ddpjobs.ddpjob.io/status", elsewhere),
        ("create", "pods", elsewhere), ("delete", "pods", elsewhere), ("get", "pods", elsewhere),
        ("watch", "pods", anywhere), ("list", "pods", anywhere),
        ("patch", "pods", elsewhere),  # only the restart request of an in-place stall restart (issue 23 #11)
        ("create", "services", elsewhere), ("get", "services", elsewhere), ("watch", "services", anywhere),
        ("create", "persistentvolumeclaims", elsewhere), ("create", "serviceaccounts", elsewhere),
        ("create", "roles.rbac.authorization.k8s.io", elsewhere),
        ("create", "rolebindings.rbac.authorization.k8s.io", elsewhere),
        ("create", "networkpolicies.networking.k8s.io", elsewhere),
        ("list", "networkpolicies.networking.k8s.io", anywhere),
        ("create", "events", elsewhere),
        ("list", "namespaces", []), ("watch", "customresourcedefinitions.apiextensions.k8s.io", []),
        ("get", "nodes", []),
    ]
    denied = [
        ("get", "secrets", elsewhere), ("list", "secrets", anywhere), ("get", "configmaps", elsewhere),
        ("create", "ddpjobs.ddpjob.io", elsewhere), ("update", "pods", elsewhere),
        ("create", "pods/exec", elsewhere), ("patch", "pods/status", elsewhere),
        ("delete", "ddpjobs.ddpjob.io/status", elsewhere),
        ("update", "ddpjobs.ddpjob.io/scale", elsewhere), ("create", "deployments.apps", elsewhere),
        ("patch", "nodes", []), ("delete", "nodes", []), ("create", "nodes", []),
        ("delete", "namespaces", []), ("create", "namespaces", []),
        ("delete", "customresourcedefinitions.apiextensions.k8s.io", []),
        ("update", "customresourcedefinitions.apiextensions.k8s.io", []),
        ("create", "clusterroles.rbac.authorization.k8s.io", []),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io", []),
        ("escalate", "roles.rbac.authorization.k8s.io", elsewhere),
        ("bind", "roles.rbac.authorization.k8s.io", elsewhere),
        ("impersonate", "serviceaccounts", elsewhere), ("create", "serviceaccounts/token", elsewhere),
        ("delete", "persistentvolumes", []), ("create", "persistentvolumes", []),
        # Verbs the operator no longer uses (kube.PERMISSIONS): granted before, refused now.
        ("patch", "ddpjobs.ddpjob.io", elsewhere), ("update", "ddpjobs.ddpjob.io", elsewhere),
        ("get", "ddpjobs.ddpjob.io/scale", elsewhere),
        ("delete", "services", elsewhere), ("delete", "serviceaccounts", elsewhere),
        ("delete", "roles.rbac.authorization.k8s.io", elsewhere), ("patch", "events", elsewhere),
        ("create", "events.events.k8s.io", elsewhere), ("delete", "networkpolicies.networking.k8s.io", elsewhere),
    ]
    wrong = [f"allowed? {v} {r} {s}" for v, r, s in allowed if not can(cluster, sa, v, r, *s)]
    wrong += [f"denied? {v} {r} {s}" for v, r, s in denied if can(cluster, sa, v, r, *s)]
    assert not wrong, "RBAC differs from least privilege:\n" + "\n".join(wrong)


def test_users_bound_to_edit_manage_ddpjobs_and_to_view_only_read_them(
        cluster: Cluster, release: str, other_namespace: str) -> None:
    """The chart's user roles (templates/userroles.yaml) aggregate into the built-in ClusterRoles: a user bound to
    `edit` in one namespace creates and manages DDPJobs there, one bound to `view` reads them (what `kubectl ddpjob
    describe` reads), and neither reaches another namespace."""
    for user, role in (("alice", "edit"), ("bob", "view")):
        cluster.kubectl("create", "rolebinding", f"{user}-{role}", f"--clusterrole={role}", f"--user={user}",
                        "-n", other_namespace)
    here, there = ["-n", other_namespace], ["-n", release]
    expected = [
        ("alice", "create", "ddpjobs.ddpjob.io", here, True), ("alice", "delete", "ddpjobs.ddpjob.io", here, True),
        ("alice", "patch", "ddpjobs.ddpjob.io", here, True), ("alice", "patch", "ddpjobs.ddpjob.io/scale", here, True),
        ("alice", "get", "ddpjobs.ddpjob.io/status", here, True),
        ("alice", "patch", "ddpjobs.ddpjob.io/status", here, False),  # the operator's to write
        ("alice", "create", "ddpjobs.ddpjob.io", there, False),
        ("bob", "get", "ddpjobs.ddpjob.io", here, True), ("bob", "list", "ddpjobs.ddpjob.io", here, True),
        ("bob", "watch", "ddpjobs.ddpjob.io", here, True), ("bob", "get", "ddpjobs.ddpjob.io/status", here, True),
        ("bob", "list", "events", here, True), ("bob", "get", "pods", here, True),
        ("bob", "create", "ddpjobs.ddpjob.io", here, False), ("bob", "delete", "ddpjobs.ddpjob.io", here, False),
        ("bob", "patch", "ddpjobs.ddpjob.io/scale", here, False), ("bob", "get", "ddpjobs.ddpjob.io", there, False),
    ]

    def wrong() -> list[str]:
        return [f"{user} {verb} {res} {scope}: expected {'yes' if ok else 'no'}"
                for user, verb, res, scope, ok in expected if can(cluster, user, verb, res, *scope) != ok]

    # The aggregation controller (kube-controller-manager) folds the chart's rules into edit/view within seconds.
    wait_for(lambda: not wrong(), timeout=30, interval=1, describe="the user roles aggregated",
             state=lambda: "\n".join(wrong()))


def test_operator_can_create_the_workers_identity(cluster: Cluster, release: str, other_namespace: str) -> None:
    """RBAC forbids granting what one does not hold: the operator's own rights must cover the worker Role (the
    very objects builders.build_worker_identity makes)."""
    sa = f"system:serviceaccount:{release}:{RELEASE}"
    identity = build_worker_identity(other_namespace)
    for obj in identity:
        cluster.kubectl("create", f"--as={sa}", "-f", "-", stdin=json.dumps(obj))
    role = identity[1]
    # ...but not a Role granting more than it holds (here: secrets).
    role["metadata"]["name"] = "greedy"
    role["rules"] = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]
    proc = cluster.kubectl("create", f"--as={sa}", "-f", "-", stdin=json.dumps(role), check=False)
    assert proc.returncode != 0 and "forbidden" in proc.stderr.lower(), proc.stderr


def test_children_pass_owner_reference_enforcement(cluster: Cluster, release: str) -> None:
    """Issue 23 #9: the control plane runs OwnerReferencesPermissionEnforcement (OpenShift's default). Every child
    refers to its DDPJob with blockOwnerDeletion, which that plugin allows only to whoever may update the job's
    finalizers: without that right in the chart, every child the operator creates is refused."""
    sa = f"system:serviceaccount:{release}:{RELEASE}"
    manifest = {"apiVersion": "ddpjob.io/v1alpha1", "kind": "DDPJob",
                "metadata": {"name": "owner", "namespace": release},
                "spec": {"replicas": 1, "template": {"spec": {"containers": [
                    {"name": "trainer", "image": "busybox", "command": ["python", "train.py"]}]}}}}
    created = json.loads(cluster.kubectl("create", "-o", "json", "-f", "-", stdin=json.dumps(manifest)).stdout)
    service = build_service(parse_ddpjob(created))
    service["metadata"]["ownerReferences"] = [owner_reference(created)]  # what the operator adds (kopf.adopt)
    assert service["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] is True
    proc = cluster.kubectl("create", f"--as={sa}", "-f", "-", stdin=json.dumps(service), check=False)
    assert proc.returncode == 0, proc.stderr


def _as_worker_of(cluster: Cluster, namespace: str, pod: str, tmp: Path) -> InClusterApi:
    """The worker runtime's own status client (progress.InClusterApi: a merge patch of ddpjobs/status, which is
    all the workers' Role allows) as the namespace's ddpjob-worker account, with a token the API server binds to
    ``pod``: what the kubelet mounts into that pod."""
    token = cluster.kubectl("create", "token", WORKER_SA, "-n", namespace, "--bound-object-kind", "Pod",
                            "--bound-object-name", pod).stdout.strip()
    raw = json.loads(cluster.kubectl("config", "view", "--raw", "--minify", "-o", "json").stdout)
    server = raw["clusters"][0]["cluster"]
    (tmp / "token").write_text(token)
    ca = tmp / "ca.crt"
    if "certificate-authority-data" in server:
        ca.write_bytes(base64.b64decode(server["certificate-authority-data"]))
    else:
        ca.write_text(Path(server["certificate-authority"]).read_text())
    address = urlsplit(server["server"])
    return InClusterApi(address.hostname or "", address.port or 443, tmp / "token", ca)


def test_a_worker_may_patch_only_its_own_jobs_progress(cluster: Cluster, release: str, tmp_path: Path) -> None:
    """Issue 23 #5: the namespace's workers share one account allowed to patch every job's status; the chart's
    ValidatingAdmissionPolicy holds each to its own job (the pod its token names) and to status.progress."""
    for obj in build_worker_identity(release):
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(obj))
    for job in ("a", "ab"):
        cluster.kubectl("create", "-n", release, "-f", "-", stdin=json.dumps({
            "apiVersion": "ddpjob.io/v1alpha1", "kind": "DDPJob", "metadata": {"name": job},
            "spec": {"replicas": 1, "template": {"spec": {"containers": [
                {"name": "trainer", "image": "busybox", "command": ["python", "train.py"]}]}}}}))
    cluster.kubectl("create", "-n", release, "-f", "-", stdin=json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a-worker-0"},
        "spec": {"serviceAccountName": WORKER_SA, "containers": [{"name": "trainer", "image": "busybox"}]}}))
    worker = _as_worker_of(cluster, release, "a-worker-0", tmp_path)

    def patch(job: str, status: dict[str, object]) -> str:
        """'' when the API server took the patch, else its refusal."""
        try:
            worker.patch_namespaced_custom_object_status("ddpjob.io", "v1alpha1", release, "ddpjobs", job,
                                                         {"status": status}, _request_timeout=10)
        except ApiError as err:
            return str(err)
        return ""

    mine = patch("a", {"progress": {"globalStep": 7, "source": "Reporter"}})
    assert mine == "", mine
    status: Any = get_json(cluster, "ddpjob", "a", "-n", release)["status"]
    assert status["progress"]["globalStep"] == 7
    # "ab": a name that only starts like the pod's job. The API server applies a new ValidatingAdmissionPolicy
    # once its informer has it (seconds after `helm install`): until then the patch goes through; the policy
    # must refuse it within 30 s.
    other = wait_for(lambda: patch("ab", {"progress": {"globalStep": 1}}), timeout=30, interval=0.5,
                     describe="the worker admission policy refusing a patch of another job")
    assert "not one of ab's workers" in other, other
    verdict = patch("a", {"conditions": [{"type": "Succeeded", "status": "True", "reason": "Forged",
                                          "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}]})
    assert "status.progress only" in verdict, verdict
    count = patch("a", {"progress": {"globalStep": 8}, "incidentCount": 99})
    assert "status.progress only" in count, count
    status = get_json(cluster, "ddpjob", "a", "-n", release)["status"]
    assert "incidentCount" not in status and status["progress"]["globalStep"] == 7


def test_rbac_namespaced_mode_reaches_only_watched_namespaces(
    cluster: Cluster, helm: Helm, namespace: str, other_namespace: str
) -> None:
    helm("install", RELEASE, str(CHART), "--namespace", namespace, "--set", f"watchNamespaces={{{other_namespace}}}",
         *ADOPT_CRD)
    try:
        sa = f"system:serviceaccount:{namespace}:{RELEASE}"
        assert can(cluster, sa, "create", "pods", "-n", other_namespace)
        assert can(cluster, sa, "patch", "ddpjobs.ddpjob.io/status", "-n", other_namespace)
        assert not can(cluster, sa, "create", "pods", "-n", "default")
        assert not can(cluster, sa, "list", "ddpjobs.ddpjob.io", "--all-namespaces")
        assert not can(cluster, sa, "list", "namespaces")
        assert can(cluster, sa, "list", "customresourcedefinitions.apiextensions.k8s.io")
    finally:
        helm("uninstall", RELEASE, "--namespace", namespace, "--wait", check=False)


def test_kubectl_apply_install_manifest(cluster: Cluster) -> None:
    """The checked-in manifest applies as is; afterwards everything but the CRD is removed again (other tests
    in this session use the CRD)."""
    docs = [d for d in yaml.safe_load_all(INSTALL.read_text()) if d]
    ns = next(d["metadata"]["name"] for d in docs if d["kind"] == "Namespace")
    try:
        cluster.kubectl("apply", "-f", str(INSTALL))
        wait_for(lambda: crd_established(cluster), timeout=60, describe=f"CRD {CRD} established")
        assert exists(cluster, "deployment", RELEASE, "-n", ns)
        assert exists(cluster, "clusterrolebinding", f"{ns}-{RELEASE}")
        # Applying again is a no-op, as users will do on every upgrade. kubectl says "configured" for the
        # PodDisruptionBudget every time (its selector's patch strategy is replace, so client-side apply always
        # sends it); its resourceVersion shows nothing changed.
        pdb = ("pdb", RELEASE, "-n", ns, "-o", "jsonpath={.metadata.resourceVersion}")
        before = cluster.kubectl("get", *pdb).stdout
        again = cluster.kubectl("apply", "-f", str(INSTALL)).stdout
        changed = [line for line in again.splitlines() if "configured" in line and "poddisruptionbudget" not in line]
        assert not changed, again
        assert cluster.kubectl("get", *pdb).stdout == before
    finally:
        rest = [d for d in docs if d["kind"] not in ("CustomResourceDefinition", "Namespace")]
        cluster.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-",
                        stdin=yaml.safe_dump_all(rest), check=False)
        cluster.kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=false", check=False)


def example_files() -> list[Path]:
    return sorted(EXAMPLES.glob("**/*.yaml")) if EXAMPLES.is_dir() else []  # kueue/ too: Kueue runs in the cluster


@pytest.mark.skipif(not example_files(), reason="manifests/examples/ does not exist yet (owned by the operator work)")
@pytest.mark.parametrize("example", example_files(), ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_example_passes_server_side_dry_run(cluster: Cluster, ddpjob_crd: str, namespace: str, example: Path) -> None:
    text = example.read_text()
    assert text.lstrip().startswith("#"), f"{example.name} needs a comment header saying what it shows"
    proc = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(example))
    assert "created (server dry run)" in proc.stdout, proc.stdout

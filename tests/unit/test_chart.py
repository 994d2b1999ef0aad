"""The Helm chart, checked over `helm template` output: defaults, both RBAC modes, security, schema, drift."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from ddpjob_operator.kube.client import CLUSTER_PERMISSIONS, PERMISSIONS

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "ddpjob-operator"
CRD_SOURCE = REPO / "operator" / "ddpjob_operator" / "crd" / "ddpjob-crd.yaml"
CRD_COPY = CHART / "files" / "ddpjob-crd.yaml"
INSTALL = REPO / "manifests" / "install.yaml"
#: `helm template` checks Chart.yaml's kubeVersion against this (offline its default is v1.20, which the chart refuses).
KUBE = "--kube-version=1.30.0"

Obj = dict[str, Any]
Render = Callable[..., list[Obj]]

# What the operator uses, as (apiGroup, resource) -> verbs: the table in kube/client.py next to the calls. The chart
# must grant exactly this: a new verb is a deliberate, reviewed change to the operator's privileges.
NAMESPACED_RULES: dict[tuple[str, str], set[str]] = {k: set(v) for k, v in PERMISSIONS.items()}
CLUSTER_READ_RULES: dict[tuple[str, str], set[str]] = {
    k: set(v) for k, v in CLUSTER_PERMISSIONS.items() if k != ("", "namespaces")
}


@pytest.fixture(scope="module")
def helm() -> Path:
    from tests.cluster.controlplane import tool

    return tool("helm")


@pytest.fixture(scope="module")
def render(helm: Path) -> Render:
    def _render(*sets: str, namespace: str = "ddpjob-system", release: str = "ddpjob-operator") -> list[Obj]:
        args = [str(helm), "template", release, str(CHART), "--namespace", namespace, KUBE]
        for s in sets:
            args += ["--set", s]
        out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
        return [d for d in yaml.safe_load_all(out) if d]

    return _render


def by_kind(objs: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[Obj], kind: str) -> Obj:
    found = by_kind(objs, kind)
    assert len(found) == 1, f"expected one {kind}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def rules_of(role: Obj) -> dict[tuple[str, str], set[str]]:
    """Flatten RBAC rules to (group, resource) -> verbs, refusing wildcards and resourceNames surprises."""
    flat: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"], rule
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                flat.setdefault((group, res), set()).update(rule["verbs"])
    return flat


def container(objs: list[Obj]) -> Obj:
    containers = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def test_default_render_has_the_expected_objects(render: Render) -> None:
    objs = render()
    kinds = sorted(o["kind"] for o in objs)
    assert kinds == sorted(["ServiceAccount", "ClusterRole", "ClusterRole", "ClusterRole", "ClusterRole",
                            "ClusterRoleBinding", "ClusterRoleBinding", "Service", "Deployment", "Role", "RoleBinding",
                            "PodDisruptionBudget", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                            "CustomResourceDefinition", "FlowSchema", "FlowSchema", "PriorityLevelConfiguration",
                            "PriorityLevelConfiguration"])
    for o in objs:
        if o["kind"] == "CustomResourceDefinition":
            continue  # the source file's labels, as every install path applies it (Helm adds its own on create)
        labels = o["metadata"]["labels"]
        for key in ("name", "instance", "version", "managed-by", "component", "part-of"):
            assert f"app.kubernetes.io/{key}" in labels, (o["kind"], key)
        if o["kind"] not in ("ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                             "ValidatingAdmissionPolicyBinding", "FlowSchema", "PriorityLevelConfiguration"):
            assert o["metadata"]["namespace"] == "ddpjob-system"


def test_deployment_runs_the_operator_with_probe_and_resources(render: Render) -> None:
    objs = render()
    dep = one(objs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == one(objs, "ServiceAccount")["metadata"]["name"]
    c = container(objs)
    assert c["image"] == "ddpjob-operator:0.1.0"
    assert c["command"] == ["ddpjob"]
    assert c["args"] == ["operator", "--metrics-port=8080", "--liveness-port=8081", "--resync-seconds=60",
                         "--api-qps=300", "--api-burst=600", "--report-writes-per-second=50",
                         "--runtime-image=ddpjob-runtime:0.1.0",
                         "--worker-admission-policy=ddpjob-system-ddpjob-operator-worker-status", "--leader-elect",
                         "--leader-election-lease=ddpjob-operator", "--lease-duration=15", "--renew-deadline=10",
                         "--retry-period=2"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"metrics": 8080, "healthz": 8081}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    svc = one(objs, "Service")
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"


def test_security_context_is_locked_down(render: Render) -> None:
    objs = render()
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container(objs)["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    # The only writable path: an emptyDir at /tmp.
    assert container(objs)["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert pod["volumes"][0]["name"] == "tmp" and "emptyDir" in pod["volumes"][0]


AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"


def aggregated(role: Obj) -> set[str]:
    """The built-in ClusterRoles ``role`` is aggregated into (its aggregate-to-* labels)."""
    return {k.removeprefix(AGGREGATE) for k in role["metadata"]["labels"] if k.startswith(AGGREGATE)}


def operator_cluster_roles(objs: list[Obj]) -> list[Obj]:
    """The ClusterRoles the operator is bound to: not the users' (aggregated into edit/admin/view)."""
    return [r for r in by_kind(objs, "ClusterRole") if not aggregated(r)]


def test_user_roles_aggregate_into_edit_admin_and_view_and_grant_only_ddpjobs(render: Render) -> None:
    """Issue 44 #4: a user bound to `edit`/`admin` manages DDPJobs, one bound to `view` reads them; the status is
    the operator's to write (tests/integration/test_packaging.py asks the API server the same)."""
    roles = {r["metadata"]["name"]: r for r in by_kind(render(), "ClusterRole") if aggregated(r)}
    edit, view = roles.pop("ddpjob-system-ddpjob-operator-edit"), roles.pop("ddpjob-system-ddpjob-operator-view")
    assert roles == {}
    assert aggregated(edit) == {"admin", "edit"} and aggregated(view) == {"view"}
    assert rules_of(edit) == {("ddpjob.io", "ddpjobs"): {"create", "delete", "deletecollection", "get", "list",
                                                         "patch", "update", "watch"},
                              ("ddpjob.io", "ddpjobs/scale"): {"get", "patch", "update"},
                              ("ddpjob.io", "ddpjobs/status"): {"get"}}
    assert rules_of(view) == {("ddpjob.io", r): {"get", "list", "watch"}
                              for r in ("ddpjobs", "ddpjobs/status", "ddpjobs/scale")}
    assert by_kind(render("rbac.userRoles=false"), "ClusterRole") == operator_cluster_roles(render())


def test_cluster_wide_rbac_is_exactly_what_the_operator_needs(render: Render) -> None:
    objs = render()
    roles = {r["metadata"]["name"]: rules_of(r) for r in operator_cluster_roles(objs)}
    main = roles.pop("ddpjob-system-ddpjob-operator")
    assert main == {**NAMESPACED_RULES, ("", "namespaces"): {"list", "watch"}}
    assert roles == {"ddpjob-system-ddpjob-operator-cluster-read": CLUSTER_READ_RULES}
    sa = one(objs, "ServiceAccount")["metadata"]
    for binding in by_kind(objs, "ClusterRoleBinding"):
        assert binding["roleRef"]["name"] == binding["metadata"]["name"]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}]


def test_watch_namespaces_uses_roles_and_namespace_flags(render: Render) -> None:
    objs = [o for o in render("watchNamespaces={team-a,team-b}")
            if not o["metadata"]["name"].endswith("-leader-election")]  # the Lease's Role: its own test
    roles = by_kind(objs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for r in roles:
        assert rules_of(r) == NAMESPACED_RULES
    bindings = by_kind(objs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for b in bindings:
        assert b["subjects"][0]["namespace"] == "ddpjob-system"
    # No cluster-wide grant on any namespaced resource: only the read-only CRD/node role remains.
    assert [rules_of(r) for r in operator_cluster_roles(objs)] == [CLUSTER_READ_RULES]
    assert container(objs)["args"][-2:] == ["--namespace=team-a", "--namespace=team-b"]

    bare = render("watchNamespaces={team-a}", "rbac.crdRead=false", "rbac.nodeRead=false", "rbac.kueueRead=false",
                  "rbac.admissionPolicyRead=false", "rbac.userRoles=false")
    assert by_kind(bare, "ClusterRole") == [] and by_kind(bare, "ClusterRoleBinding") == []


def test_the_worker_admission_policy_is_never_skipped_without_a_word(helm: Path, render: Render) -> None:
    """Issue 43 #4: an API server that does not serve ValidatingAdmissionPolicy fails the install unless the value
    is off; an offline render (no kind known) renders it; the operator is told its name and may read it, by name."""
    def template(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(helm), "template", "r", str(CHART), "-n", "ns", KUBE, *args], capture_output=True,
                              text=True)

    live_old = template("--api-versions", "apps/v1/Deployment")  # a live server's kinds, without the policy's
    assert live_old.returncode != 0 and "does not serve ValidatingAdmissionPolicy" in live_old.stderr
    assert "rbac.workerAdmissionPolicy=false" in live_old.stderr
    opted_out = template("--api-versions", "apps/v1/Deployment", "--set", "rbac.workerAdmissionPolicy=false")
    assert opted_out.returncode == 0 and "ValidatingAdmissionPolicy" not in opted_out.stdout
    served = template("--api-versions", "apps/v1/Deployment",
                      "--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy")
    assert served.returncode == 0 and "kind: ValidatingAdmissionPolicyBinding" in served.stdout
    objs = render()
    name = one(objs, "ValidatingAdmissionPolicy")["metadata"]["name"]
    assert one(objs, "ValidatingAdmissionPolicyBinding")["spec"]["policyName"] == name
    assert f"--worker-admission-policy={name}" in container(objs)["args"]
    read = next(r for r in by_kind(objs, "ClusterRole") if r["metadata"]["name"].endswith("-cluster-read"))
    rule = next(r for r in read["rules"] if r["apiGroups"] == ["admissionregistration.k8s.io"])
    assert rule["resourceNames"] == [name] and rule["verbs"] == ["get"]
    assert f"--worker-admission-policy={name}" in container(render("rbac.workerAdmissionPolicy=false"))["args"], \
        "checked even when off: every job then says its status is unprotected"


def test_two_releases_do_not_share_cluster_scoped_names(render: Render) -> None:
    cluster_scoped = ("Cluster", "FlowSchema", "PriorityLevelConfiguration")
    a = {(o["kind"], o["metadata"]["name"]) for o in render(namespace="ns-a") if o["kind"].startswith(cluster_scoped)}
    b = {(o["kind"], o["metadata"]["name"]) for o in render(namespace="ns-b") if o["kind"].startswith(cluster_scoped)}
    assert a and not a & b


def test_the_operators_requests_and_the_workers_progress_writes_have_priority_levels_of_their_own(
        render: Render) -> None:
    """Issue 46: the operator's ServiceAccount, every request, in its own level; the workers' status patches (any
    ServiceAccount, ddpjobs/status only) in a smaller one queued per namespace, matched after the operator's."""
    objs = render("serviceAccount.name=op")
    schemas = {o["metadata"]["name"]: o["spec"] for o in by_kind(objs, "FlowSchema")}
    levels = {o["metadata"]["name"]: o["spec"] for o in by_kind(objs, "PriorityLevelConfiguration")}
    op, progress = schemas["ddpjob-system-ddpjob-operator"], schemas["ddpjob-system-ddpjob-operator-progress"]
    assert op["rules"][0]["subjects"] == [{"kind": "ServiceAccount",
                                           "serviceAccount": {"name": "op", "namespace": "ddpjob-system"}}]
    assert op["rules"][0]["resourceRules"][0]["verbs"] == ["*"]
    assert progress["rules"] == [{"subjects": [{"kind": "Group", "group": {"name": "system:serviceaccounts"}}],
                                  "resourceRules": [{"verbs": ["patch"], "apiGroups": ["ddpjob.io"],
                                                     "resources": ["ddpjobs/status"], "namespaces": ["*"]}]}]
    assert op["matchingPrecedence"] < progress["matchingPrecedence"] < 900  # before kube-system's and all SAs'
    assert progress["distinguisherMethod"] == {"type": "ByNamespace"}
    for name, spec in schemas.items():
        assert spec["priorityLevelConfiguration"]["name"] == name and levels[name]["type"] == "Limited"
    assert levels["ddpjob-system-ddpjob-operator"]["limited"]["nominalConcurrencyShares"] == 40
    assert levels["ddpjob-system-ddpjob-operator-progress"]["limited"]["nominalConcurrencyShares"] == 10
    assert not by_kind(render("flowControl.enabled=false"), "FlowSchema")


def test_optional_pieces(render: Render) -> None:
    assert not by_kind(render(), "ServiceMonitor")
    sm = one(render("metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.labels.release=prom"),
             "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert not by_kind(render("metrics.service.enabled=false"), "Service")
    digest = "sha256:" + "a" * 64
    assert container(render(f"image.digest={digest}"))["image"] == f"ddpjob-operator@{digest}"
    assert container(render("image.tag=dev"))["image"] == "ddpjob-operator:dev"
    objs = render("serviceAccount.create=false", "serviceAccount.name=existing")
    assert not by_kind(objs, "ServiceAccount")
    assert one(objs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "existing"


def _multikueue_roles(objs: list[Obj]) -> dict[str, tuple[dict[tuple[str, str], set[str]], list[Obj]]]:
    """ClusterRole name -> (its rules as (apiGroup, resource) -> verbs, its binding's subjects), MultiKueue's only."""
    bindings = {b["roleRef"]["name"]: b["subjects"] for b in by_kind(objs, "ClusterRoleBinding")}
    return {r["metadata"]["name"]: ({(g, res): set(rule["verbs"]) for rule in r["rules"]
                                     for g in rule["apiGroups"] for res in rule["resources"]},
                                    bindings[r["metadata"]["name"]])
            for r in by_kind(objs, "ClusterRole") if "multikueue" in r["metadata"]["name"]}


def test_multikueue_rbac_is_off_by_default_and_grants_kueue_exactly_what_its_adapter_uses(render: Render) -> None:
    """Issue 45 #6: Kueue's generic MultiKueue adapter watches DDPJobs and patches their status in the manager, and
    creates, reads and deletes the copies in a worker; nothing else (docs/scheduling.md, "More than one cluster")."""
    assert _multikueue_roles(render()) == {}
    roles = _multikueue_roles(render("multiKueue.manager.enabled=true"))
    assert roles == {"ddpjob-system-ddpjob-operator-multikueue-manager": (
        {("ddpjob.io", "ddpjobs"): {"get", "list", "watch"}, ("ddpjob.io", "ddpjobs/status"): {"patch"}},
        [{"kind": "ServiceAccount", "name": "kueue-controller-manager", "namespace": "kueue-system"}])}
    user = "multiKueue.worker.subjects[0].kind=User,multiKueue.worker.subjects[0].name=mk"
    roles = _multikueue_roles(render("multiKueue.worker.enabled=true", user))
    assert roles == {"ddpjob-system-ddpjob-operator-multikueue-worker": (
        {("ddpjob.io", "ddpjobs"): {"create", "delete", "get", "list", "watch"}},
        [{"kind": "User", "name": "mk", "apiGroup": "rbac.authorization.k8s.io"}])}
    (_, subjects), = _multikueue_roles(render("multiKueue.worker.enabled=true")).values()
    assert subjects == [{"kind": "ServiceAccount", "name": "multikueue-sa", "namespace": "kueue-system"}]
    with pytest.raises(subprocess.CalledProcessError) as refused:
        render("multiKueue.worker.enabled=true", "multiKueue.worker.subjects=null")
    assert "multiKueue.worker.enabled needs multiKueue.worker.subjects" in refused.value.stderr


def test_alerts_and_dashboard_are_off_by_default_and_one_flag_each(render: Render) -> None:
    assert not by_kind(render(), "PrometheusRule") and not by_kind(render(), "ConfigMap")
    rule = one(render("metrics.prometheusRule.enabled=true", "metrics.prometheusRule.labels.release=prom",
                      "metrics.prometheusRule.checkpointAgeSeconds=600"), "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prom"
    exprs = {r["alert"]: r["expr"] for r in rule["spec"]["groups"][0]["rules"]}
    assert exprs["DDPJobCheckpointTooOld"].endswith("> 600")
    assert 'job="ddpjob-operator-metrics", namespace="ddpjob-system"' in exprs["DDPJobOperatorDown"]
    board = one(render("metrics.dashboard.enabled=true"), "ConfigMap")
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(board["data"]["ddpjob-operator.json"])["uid"] == "ddpjob-operator"


def test_two_replicas_elect_a_leader_over_their_own_lease(render: Render) -> None:
    objs = render()
    deploy = one(objs, "Deployment")
    args = container(objs)["args"]
    assert deploy["spec"]["replicas"] == 2 and deploy["spec"]["strategy"]["type"] == "RollingUpdate"
    assert "--leader-elect" in args and "--leader-election-lease=ddpjob-operator" in args
    assert {"--lease-duration=15", "--renew-deadline=10", "--retry-period=2"} <= set(args)
    role = next(r for r in by_kind(objs, "Role") if r["metadata"]["name"].endswith("-leader-election"))
    assert role["metadata"]["namespace"] == "ddpjob-system"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["ddpjob-operator"],
         "verbs": ["get", "update"]}]
    assert one(objs, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    anti = deploy["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["topologyKey"] == \
        "kubernetes.io/hostname"
    # Without leader election: one replica, Recreate, no Lease, no budget; two replicas refused.
    single = render("leaderElection.enabled=false", "replicaCount=1")
    assert one(single, "Deployment")["spec"]["strategy"]["type"] == "Recreate"
    assert "--leader-elect" not in container(single)["args"]
    assert not by_kind(single, "PodDisruptionBudget") and not [
        r for r in by_kind(single, "Role") if r["metadata"]["name"].endswith("-leader-election")]
    with pytest.raises(subprocess.CalledProcessError) as refused:
        render("leaderElection.enabled=false")
    assert "needs leaderElection.enabled=true" in refused.value.stderr


@pytest.mark.parametrize(("timing", "ok"), [
    ("15,10,2", True), ("4,3,1", True),
    ("15,14,4", False),  # client-go's rule holds; the margin does not (kube/leader.py, Timing.error)
    ("15,15,2", False), ("15,6,5", False),
])
def test_unsafe_lease_timings_are_refused_as_the_operator_refuses_them(render: Render, timing: str, ok: bool) -> None:
    lease, renew, retry = timing.split(",")
    values = (f"leaderElection.leaseDurationSeconds={lease}", f"leaderElection.renewDeadlineSeconds={renew}",
              f"leaderElection.retryPeriodSeconds={retry}")
    from ddpjob_operator.kube.leader import Timing

    assert (Timing(float(lease), float(renew), float(retry)).error() is None) is ok
    if ok:
        assert f"--renew-deadline={renew}" in container(render(*values))["args"]
        return
    with pytest.raises(subprocess.CalledProcessError) as refused:
        render(*values)
    assert "leaseDurationSeconds - renewDeadlineSeconds >= retryPeriodSeconds" in refused.value.stderr


@pytest.mark.parametrize("bad", [
    "unknownTopLevel=1",
    "image.registry=registry.example",
    "rbac.everything=true",
    "watchNamespaces={Not_A_Namespace}",
    "image.pullPolicy=Sometimes",
    "liveness.port=70000",
    "imageRegistry=https://registry.example/ml",
    "multiKueue.worker.subjects[0].kind=ServiceAccount,multiKueue.worker.subjects[0].name=x",  # no namespace
    "multiKueue.manager.serviceAccount.name=",
])
def test_schema_rejects_unknown_or_invalid_values(helm: Path, bad: str) -> None:
    proc = subprocess.run([str(helm), "template", "x", str(CHART), KUBE, "--set", bad], capture_output=True, text=True)
    assert proc.returncode != 0, f"--set {bad} was accepted"
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr


def test_every_value_has_a_comment_above_it() -> None:
    """cert-manager style: each key the schema describes is documented in values.yaml."""
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())
    lines = (CHART / "values.yaml").read_text().splitlines()
    missing: list[str] = []

    def walk(props: dict[str, Any], start: int, end: int, indent: int) -> None:
        for key, sub in props.items():
            prefix = " " * indent + f"{key}:"
            idx = next((i for i in range(start, end) if lines[i].startswith(prefix)), None)
            if idx is None:
                missing.append(f"{key} (not in values.yaml)")
                continue
            if not lines[idx - 1].strip().startswith("#"):
                missing.append(key)
            if "properties" in sub:
                stop = next((i for i in range(idx + 1, end)
                             if lines[i].strip() and len(lines[i]) - len(lines[i].lstrip()) <= indent), end)
                walk(sub["properties"], idx + 1, stop, indent + 2)

    walk(schema["properties"], 0, len(lines), 0)
    assert not missing, f"values without a comment above them: {missing}"


def test_chart_crd_equals_the_source() -> None:
    """The CRD has one source (the operator package); the chart's copy must not drift (`make chart-crd`)."""
    assert CRD_COPY.read_bytes() == CRD_SOURCE.read_bytes(), "run `make chart-crd`"


def test_the_crd_is_a_release_resource_that_helm_upgrade_upgrades_and_uninstall_keeps(render: Render) -> None:
    """Issue 44 #5: Helm installs crds/ once and never upgrades it; a template is upgraded with the release. The
    schema is the source's, byte for byte but for Helm's keep policy (uninstall must not delete every DDPJob)."""
    crd = one(render(), "CustomResourceDefinition")
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    source = yaml.safe_load(CRD_SOURCE.read_text())
    del crd["metadata"]["annotations"]
    assert crd == source
    # A second release in the cluster, or a CRD managed apart: none rendered.
    assert not by_kind(render("crd.install=false"), "CustomResourceDefinition")
    # `helm upgrade --reuse-values` from chart 0.3.0 or older: its values have no `crd` key at all.
    assert one(render("crd=null"), "CustomResourceDefinition")["metadata"]["name"] == "ddpjobs.ddpjob.io"


def test_one_value_names_the_registry_of_both_images(render: Render) -> None:
    """Issue 44 #1: `REGISTRY=r make images push` pushes both images under r; imageRegistry=r is all the chart needs
    (a digest still wins over the tag; a trailing slash is forgiven)."""
    c = container(render("imageRegistry=registry.example:5000/ml/"))
    assert c["image"] == "registry.example:5000/ml/ddpjob-operator:0.1.0"
    assert "--runtime-image=registry.example:5000/ml/ddpjob-runtime:0.1.0" in c["args"]
    digest = "sha256:" + "a" * 64
    c = container(render("imageRegistry=r.example/ml", f"runtimeImage.digest={digest}"))
    assert c["image"] == "r.example/ml/ddpjob-operator:0.1.0"
    assert f"--runtime-image=r.example/ml/ddpjob-runtime@{digest}" in c["args"]


def test_the_chart_refuses_kubernetes_before_1_30(helm: Path) -> None:
    """kubeVersion: the worker admission policy needs ValidatingAdmissionPolicy v1 (1.30); vendor builds pass."""
    for version, ok in (("1.29.9", False), ("1.30.0", True), ("v1.30.2-eks-1234", True), ("1.34.4", True)):
        proc = subprocess.run([str(helm), "template", "r", str(CHART), f"--kube-version={version}"],
                              capture_output=True, text=True)
        assert (proc.returncode == 0) == ok, (version, proc.stderr)
        assert ok or "chart requires kubeVersion: >=1.30.0-0" in proc.stderr, proc.stderr


def test_the_charts_readme_is_generated_from_the_schema() -> None:
    """Issue 44 #2: the values table has a row per key of values.schema.json (`make chart-readme`)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("chart_readme", REPO / "hack" / "chart_readme.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fresh = mod.main(CHART)
    assert (CHART / "README.md").read_text() == fresh, "the chart's README.md is stale: run `make chart-readme`"
    assert "| `crd.install` | boolean | `true` | Install and upgrade the CRD with this release" in fresh
    assert "| `image.pullPolicy` | one of `Always`, `IfNotPresent`, `Never` | `\"IfNotPresent\"` |" in fresh


def test_install_manifest_equals_a_fresh_render(helm: Path) -> None:
    fresh = subprocess.run(
        ["bash", "hack/render-manifests.sh", str(helm), "charts/ddpjob-operator", "ddpjob-operator",
         "ddpjob-system"], capture_output=True, text=True, check=True, cwd=REPO,
    ).stdout
    assert INSTALL.read_text() == fresh, "manifests/install.yaml is stale: run `make manifests`"
    kinds = [d["kind"] for d in yaml.safe_load_all(fresh) if d]
    assert kinds[0] == "Namespace" and "CustomResourceDefinition" in kinds

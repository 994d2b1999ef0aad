"""Builders: golden YAML for the rendered worker pod and Service, and the properties every child must have."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from ddpjob_operator.api.spec import InvalidSpec, parse_ddpjob
from ddpjob_operator.planner.children import builders
from ddpjob_worker.contract import WorkerEnv

from .factories import make_job

GOLDEN = Path(__file__).parent / "golden"


def check_golden(name: str, obj: dict[str, Any]) -> None:
    """Compare with golden/<name>.yaml; UPDATE_GOLDEN=1 rewrites it."""
    path = GOLDEN / f"{name}.yaml"
    text = yaml.safe_dump(obj, sort_keys=True)
    if os.environ.get("UPDATE_GOLDEN") == "1" or not path.exists():
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs; review and rerun with UPDATE_GOLDEN=1"


def charlm() -> Any:
    return parse_ddpjob(
        make_job("charlm", "team-a", replicas=2)
        .with_spec(nprocPerNode="1")
        .with_checkpoint(volumeClaim={"size": "1Gi"}, mountPath="/checkpoints")
        .obj()
    )


def test_worker_pod_golden() -> None:
    check_golden("worker-pod", builders.build_worker_pod(charlm(), 1, generation=0))


def test_service_golden() -> None:
    check_golden("service", builders.build_service(charlm()))


def test_worker_env_round_trips_through_the_contract() -> None:
    pod = builders.build_worker_pod(charlm(), 1)
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"] if "value" in e}
    parsed = WorkerEnv.from_env(env)
    assert parsed.job_uid == "uid-charlm" and parsed.worker_index == 1
    assert parsed.rdzv_endpoint == "charlm-rdzv.charlm.team-a.svc:29400"
    assert parsed.nnodes == "2" and parsed.rdzv_conf.startswith("is_host=false")


def test_every_worker_learns_its_pods_uid_from_the_downward_api() -> None:
    """The agent's rendezvous node carries it, so a report of a silent peer names that very pod (issue 43 #6)."""
    env = builders.build_worker_pod(charlm(), 1)["spec"]["containers"][0]["env"]
    assert [e for e in env if e["name"] == "DDPJOB_POD_UID"] == [
        {"name": "DDPJOB_POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}]


def test_user_env_is_kept_beside_the_contract() -> None:
    job = make_job().obj()
    job["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "MY_VAR", "value": "kept"}]
    env = builders.build_worker_pod(parse_ddpjob(job), 0)["spec"]["containers"][0]["env"]
    values = {e["name"]: e["value"] for e in env if "value" in e}
    assert values["MY_VAR"] == "kept" and values["PET_RDZV_ENDPOINT"].startswith("job-rdzv.job.ns.svc:")
    assert values["DDPJOB_TERMINATION_LOG"] == "/dev/termination-log"


def test_rendezvous_pod_meets_the_restricted_pod_security_standard() -> None:
    pod = builders.build_rendezvous_pod(parse_ddpjob(make_job().obj()))
    sc = pod["spec"]["containers"][0]["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["runAsNonRoot"] is True and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_network_policy_admits_only_the_jobs_pods_to_any_of_its_pods() -> None:
    """Issue 23 #6: the workers too (rank 0's process-group store, gloo and NCCL), not only the store's port."""
    np = builders.build_network_policy(parse_ddpjob(make_job().obj()))
    own = {"podSelector": {"matchLabels": {"ddpjob.io/job-name": "job"}}}
    assert np["spec"]["podSelector"] == own["podSelector"]
    assert np["spec"]["policyTypes"] == ["Ingress"] and np["spec"]["ingress"] == [{"from": [own]}]
    worker, rdzv = builders.build_worker_pod(parse_ddpjob(make_job().obj()), 0), builders.build_rendezvous_pod(
        parse_ddpjob(make_job().obj()))
    for pod in (worker, rdzv):  # the policy selects both kinds of pod
        labels = pod["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in own["podSelector"]["matchLabels"].items())


def test_elastic_nnodes_and_sidecar_untouched() -> None:
    job = make_job(replicas=3).with_elastic(2, 4).obj()
    job["spec"]["template"]["spec"]["containers"].insert(0, {"name": "sidecar", "image": "busybox"})
    pod = builders.build_worker_pod(parse_ddpjob(job), 2)
    sidecar, worker = pod["spec"]["containers"]
    assert "env" not in sidecar
    assert {e["name"]: e.get("value") for e in worker["env"]}["PET_NNODES"] == "2:4"


@pytest.mark.parametrize(
    ("checkpoint", "volume"),
    [
        ({}, {"name": "checkpoints", "emptyDir": {}}),
        ({"existingClaim": "mine"}, {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "mine"}}),
        ({"volumeClaim": {}}, {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "job-checkpoints"}}),
    ],
)
def test_checkpoint_volume(checkpoint: dict[str, Any], volume: dict[str, Any]) -> None:
    job = parse_ddpjob(make_job().with_checkpoint(**checkpoint).obj())
    assert volume in builders.build_worker_pod(job, 0)["spec"]["volumes"]
    pvc = builders.build_pvc(job)
    assert (pvc is not None) == ("volumeClaim" in checkpoint)


@pytest.mark.parametrize(
    ("checkpoint", "security", "expected"),
    [
        # A claim: the worker image's GID owns the volume root, however the provisioner created it.
        ({"volumeClaim": {}}, None, {"fsGroup": 10001, "fsGroupChangePolicy": "OnRootMismatch"}),
        ({"existingClaim": "mine"}, {"runAsUser": 5}, {"runAsUser": 5, "fsGroup": 10001,
                                                       "fsGroupChangePolicy": "OnRootMismatch"}),
        # The user's own fsGroup (and policy, or its absence) wins.
        ({"volumeClaim": {}}, {"fsGroup": 42}, {"fsGroup": 42}),
        # emptyDir is world-writable: nothing to add.
        ({}, None, None),
    ],
)
def test_fs_group_makes_the_checkpoint_claim_writable(
    checkpoint: dict[str, Any], security: dict[str, Any] | None, expected: dict[str, Any] | None
) -> None:
    body = make_job().with_checkpoint(**checkpoint).obj()
    if security is not None:
        body["spec"]["template"]["spec"]["securityContext"] = security
    spec = builders.build_worker_pod(parse_ddpjob(body), 0)["spec"]
    assert spec.get("securityContext") == expected


def test_pvc_defaults() -> None:
    job = parse_ddpjob(make_job().with_checkpoint(volumeClaim={"size": "5Gi", "storageClassName": "fast"}).obj())
    pvc = builders.build_pvc(job)
    assert pvc is not None
    assert pvc["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "5Gi"}},
        "storageClassName": "fast",
    }


def test_worker_identity_is_one_per_namespace_and_may_only_patch_ddpjob_status() -> None:
    sa, role, binding = builders.build_worker_identity("team-a")
    assert [o["kind"] for o in (sa, role, binding)] == ["ServiceAccount", "Role", "RoleBinding"]
    assert {o["metadata"]["name"] for o in (sa, role, binding)} == {"ddpjob-worker"}
    assert {o["metadata"]["namespace"] for o in (sa, role, binding)} == {"team-a"}
    assert all("ownerReferences" not in o["metadata"] for o in (sa, role, binding)), "it outlives any one job"
    assert role["rules"] == [{"apiGroups": ["ddpjob.io"], "resources": ["ddpjobs/status"], "verbs": ["patch"]}]
    assert binding["roleRef"]["name"] == "ddpjob-worker"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "ddpjob-worker", "namespace": "team-a"}]


def test_pods_run_as_the_namespace_worker_identity_unless_the_template_names_one() -> None:
    job = make_job("x").obj()
    assert builders.build_worker_pod(parse_ddpjob(job), 0)["spec"]["serviceAccountName"] == "ddpjob-worker"
    job["spec"]["template"]["spec"]["serviceAccountName"] = "mine"
    assert builders.build_worker_pod(parse_ddpjob(job), 0)["spec"]["serviceAccountName"] == "mine"
    assert all(o["kind"] not in ("ServiceAccount", "Role", "RoleBinding")
               for o in builders.build_static_children(parse_ddpjob(job)))


def test_rendezvous_pod_runs_the_pure_python_store_in_the_runtime_image() -> None:
    job = make_job().obj()
    pod = builders.build_rendezvous_pod(parse_ddpjob(job))
    c = pod["spec"]["containers"][0]
    assert c["image"] == "ddpjob-runtime:dev" and c["imagePullPolicy"] == "IfNotPresent"
    assert c["command"] == ["python3", "/opt/ddpjob-runtime/bin/ddpjob-rdzv", "--port", "29400"]
    assert pod["spec"]["hostname"] == "job-rdzv" and pod["spec"]["subdomain"] == "job"
    assert pod["metadata"]["labels"]["ddpjob.io/replica-type"] == "rendezvous"
    job["spec"]["runtime"] = {"image": "registry.example/ddpjob-runtime:1.2"}
    assert builders.build_rendezvous_pod(parse_ddpjob(job))["spec"]["containers"][0]["image"] == \
        "registry.example/ddpjob-runtime:1.2"


GPU_POOL = {
    "nodeSelector": {"pool": "gpu"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}]}}},
    "priorityClassName": "training",
    "imagePullSecrets": [{"name": "pull"}],
}
CPU_POOL = {
    "nodeSelector": {"pool": "cpu"},
    "tolerations": [{"key": "spot", "operator": "Exists"}],
    "affinity": {"podAffinity": {}},
    "priorityClassName": "system-ish",
}


@pytest.mark.parametrize(("rendezvous", "expected"), [
    # The workers' placement is not the store's: a CPU-only pod on a GPU node holds it (issue 23 #10).
    ({}, {"priorityClassName": "training", "imagePullSecrets": [{"name": "pull"}]}),
    ({"nodeSelector": {"pool": "cpu"}},
     {"nodeSelector": {"pool": "cpu"}, "priorityClassName": "training", "imagePullSecrets": [{"name": "pull"}]}),
    (CPU_POOL, {**CPU_POOL, "imagePullSecrets": [{"name": "pull"}]}),
], ids=["own-defaults", "node-selector", "all-of-its-own"])
def test_rendezvous_pod_is_placed_by_its_own_fields_never_the_workers(rendezvous: dict[str, Any],
                                                                      expected: dict[str, Any]) -> None:
    job = make_job().obj()
    job["spec"]["template"]["spec"].update(copy.deepcopy(GPU_POOL))
    job["spec"]["rendezvous"] = rendezvous
    spec = builders.build_rendezvous_pod(parse_ddpjob(job))["spec"]
    keys = ("nodeSelector", "tolerations", "affinity", "priorityClassName", "imagePullSecrets")
    assert {k: spec[k] for k in keys if k in spec} == expected


@pytest.mark.parametrize(("given", "expected"), [
    (None, {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}}),
    ({"requests": {"cpu": "2"}}, {"requests": {"cpu": "2"}}),  # replaces the defaults whole: no limit below it
    ({"requests": {"cpu": 0.5, "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
     {"requests": {"cpu": "0.5", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}),
])
def test_rendezvous_pod_resources(given: dict[str, Any] | None, expected: dict[str, Any]) -> None:
    job = make_job().obj()
    if given is not None:
        job["spec"]["rendezvous"] = {"resources": given}
    pod = builders.build_rendezvous_pod(parse_ddpjob(job))
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources == expected
    resources.setdefault("limits", {})["memory"] = "1Mi"  # a caller's edit must not leak into the next pod
    assert builders.build_rendezvous_pod(parse_ddpjob(job))["spec"]["containers"][0]["resources"] == expected


@pytest.mark.parametrize(("rendezvous", "field", "words"), [
    ({"resources": {"requests": {"cpu": "lots"}}}, "spec.rendezvous.resources.requests.cpu", "not a quantity"),
    ({"resources": {"requests": {"cpu": True}}}, "spec.rendezvous.resources.requests.cpu", "not a quantity"),
    ({"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}}, "spec.rendezvous.resources.requests.cpu",
     "above its limit"),
    ({"resources": {"limits": {"nvidia.com/gpu": "1"}}}, "spec.rendezvous.resources.limits.nvidia.com/gpu",
     "uses only cpu, memory, ephemeral-storage"),
    ({"resources": {"claims": []}}, "spec.rendezvous.resources.claims", "requests and limits only"),
    ({"resources": {"requests": "1"}}, "spec.rendezvous.resources.requests", "must map resource names"),
    ({"priorityClassName": "Not_A_Name"}, "spec.rendezvous.priorityClassName", "Kubernetes object name"),
    ({"nodeSelector": {"pool": 3}}, "spec.rendezvous.nodeSelector.pool", "string"),
])
def test_rendezvous_placement_and_resources_are_refused_naming_the_field(rendezvous: dict[str, Any], field: str,
                                                                          words: str) -> None:
    job = make_job().obj()
    job["spec"]["rendezvous"] = rendezvous
    with pytest.raises(InvalidSpec) as err:
        parse_ddpjob(job)
    assert err.value.field == field and words in err.value.message, str(err.value)


def test_grace_period_and_sigterm_budget() -> None:
    job = make_job().obj()
    job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 120
    pod = builders.build_worker_pod(parse_ddpjob(job), 0)
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert pod["spec"]["terminationGracePeriodSeconds"] == 120
    assert env["DDPJOB_SIGTERM_BUDGET_SECONDS"] == "90"


@pytest.mark.parametrize(("resources", "field", "words"), [
    ({"requests": {"cpu": "two"}}, "spec.template.spec.containers[0].resources.requests.cpu", "not a quantity"),
    ({"limits": {"memory": "1Gb"}}, "spec.template.spec.containers[0].resources.limits.memory", "not a quantity"),
    ({"requests": {"cpu": "4"}, "limits": {"cpu": "2"}}, "spec.template.spec.containers[0].resources.requests.cpu",
     "above its limit"),
    ({"requests": {"cpu": "-1"}}, "spec.template.spec.containers[0].resources.requests.cpu", "negative"),
])
def test_template_quantities_are_refused_naming_the_field(resources: dict[str, Any], field: str, words: str) -> None:
    """A bad quantity in the free-form template reached the planner (a gang's minResources raised on every pass,
    with no condition) before the pod API could refuse it."""
    job = make_job().obj()
    job["spec"]["template"]["spec"]["containers"][0]["resources"] = resources
    with pytest.raises(InvalidSpec) as err:
        parse_ddpjob(job)
    assert err.value.field == field and words in err.value.message, str(err.value)


@pytest.mark.parametrize(("name", "value", "words"), [
    ("DDPJOB_DNS_WAIT_SECONDS", "soon", "must be a number of seconds >= 0"),
    ("DDPJOB_DNS_WAIT_SECONDS", "-5", "must be a number of seconds >= 0"),
    ("DDPJOB_DNS_WAIT_SECONDS", "inf", "must be a number of seconds >= 0"),
    ("DDPJOB_WARM_TRAINERS", "maybe", "must be 0 or 1"),
])
def test_a_bad_user_knob_is_refused_before_any_pod(name: str, value: str, words: str) -> None:
    """ddp-worker read these at start: every pod exited 78 with float()'s message, which named no variable."""
    job = make_job().obj()
    job["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": name, "value": value}]
    with pytest.raises(InvalidSpec) as err:
        parse_ddpjob(job)
    assert err.value.field == "spec.template.spec.containers[0].env[0].value", str(err.value)
    assert f"{name}={value!r}" in err.value.message and words in err.value.message, str(err.value)


@pytest.mark.parametrize(("name", "value"), [("DDPJOB_DNS_WAIT_SECONDS", "0"), ("DDPJOB_DNS_WAIT_SECONDS", "12.5"),
                                             ("DDPJOB_WARM_TRAINERS", "Off"), ("DDPJOB_WARM_TRAINERS", "1")])
def test_good_user_knobs_pass(name: str, value: str) -> None:
    job = make_job().obj()
    job["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": name, "value": value}]
    parse_ddpjob(job)


@pytest.mark.parametrize(("where", "value", "field", "words"), [
    ("spec", {"restartPolicy": "OnFailure"}, "spec.template.spec.restartPolicy", "restartPolicy Never"),
    ("spec", {"hostname": "trainer"}, "spec.template.spec.hostname", "set by the operator"),
    ("spec", {"subdomain": "mine"}, "spec.template.spec.subdomain", "set by the operator"),
    ("metadata", {"labels": {"ddpjob.io/replica-index": "7"}}, "spec.template.metadata.labels",
     "the operator's own label"),
])
def test_what_the_operator_would_overwrite_is_refused(where: str, value: dict[str, Any], field: str,
                                                      words: str) -> None:
    """These were overwritten on every pod without a word (issue 23 #3)."""
    job = make_job().obj()
    job["spec"]["template"].setdefault(where, {}).update(value)
    with pytest.raises(InvalidSpec) as err:
        parse_ddpjob(job)
    assert err.value.field == field and words in err.value.message, str(err.value)


def test_restart_policy_never_and_other_labels_are_fine() -> None:
    job = make_job().obj()
    job["spec"]["template"]["spec"]["restartPolicy"] = "Never"
    job["spec"]["template"]["metadata"] = {"labels": {"team": "nlp", "app.kubernetes.io/part-of": "x"}}
    assert builders.build_worker_pod(parse_ddpjob(job), 0)["metadata"]["labels"]["team"] == "nlp"

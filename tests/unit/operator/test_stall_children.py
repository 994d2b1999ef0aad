"""Table tests of the children policy (policies/children.py) and the template refusals of the spec model (stall
detection: test_stall.py)."""

from __future__ import annotations

from typing import Any

import pytest
from ddpjob_operator.api.spec import InvalidSpec, parse_ddpjob
from ddpjob_operator.planner.observation import ChildView
from ddpjob_operator.planner.policies import children
from ddpjob_operator.planner.policies.children import Problem

from .factories import make_job

pytestmark = pytest.mark.unit


JOB = parse_ddpjob(make_job().obj())


def child(kind: str, name: str, owner: str | None, label: str = "", deleting: bool = False) -> ChildView:
    return ChildView(kind=kind, name=name, uid=f"{kind}-{name}", owner_uid=owner, job_label=label, deleting=deleting)


def obj(kind: str, name: str) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"name": name}}


@pytest.mark.parametrize(
    ("name", "observed", "problems", "created_before", "create", "conflicts", "missing"),
    [
        ("first pass creates everything", {}, {}, False, ["job"], 0, []),
        ("ours: nothing to do", {("Service", "job"): child("Service", "job", JOB.uid)}, {}, True, [], 0, []),
        ("deleted by hand: created again, with an Event", {}, {}, True, ["job"], 0, ["Service job"]),
        ("foreign with our label: conflict, not adopted",
         {("Service", "job"): child("Service", "job", "other-uid", "job")}, {}, True, [], 1, []),
        ("foreign without our label, seen by a 409: conflict and a retry",
         {}, {("Service", "job"): Problem("Service", "job", True, "ChildConflict", "Service job exists ...")},
         True, ["job"], 1, []),
        ("a foreign object on its way out: wait",
         {("Service", "job"): child("Service", "job", "other-uid", "job", deleting=True)}, {}, True, [], 0, []),
    ],
)
def test_children_policy(name: str, observed: dict[Any, ChildView], problems: dict[Any, Problem],
                         created_before: bool, create: list[str], conflicts: int, missing: list[str]) -> None:
    d = children.decide([obj("Service", "job")], observed, problems, job_uid=JOB.uid, job_name="job",
                        retained_pvc=False, created_before=created_before)
    assert [o["metadata"]["name"] for o in d.create] == create, name
    assert len(d.conflicts) == conflicts, name
    assert d.missing_again == missing, name


def test_a_retained_checkpoint_pvc_of_the_same_job_name_is_ours() -> None:
    pvc = child("PersistentVolumeClaim", "job-checkpoints", None, "job")
    assert children.is_ours(pvc, JOB.uid, "job", retained_pvc=True)
    assert not children.is_ours(pvc, JOB.uid, "job", retained_pvc=False)
    assert not children.is_ours(child("PersistentVolumeClaim", "job-checkpoints", None, "other"), JOB.uid, "job",
                                retained_pvc=True)


def with_container(**fields: Any) -> dict[str, Any]:
    job = make_job().obj()
    job["spec"]["template"]["spec"]["containers"][0].update(fields)
    return job


@pytest.mark.parametrize(
    ("job", "field", "words"),
    [
        (with_container(env=[{"name": "MASTER_ADDR", "value": "x"}]),
         "spec.template.spec.containers[0].env[0].name", "MASTER_ADDR is set by the operator or torchrun"),
        (with_container(env=[{"name": "A", "value": "1"}, {"name": "PET_NNODES", "value": "3"}]),
         "spec.template.spec.containers[0].env[1].name", "PET_NNODES"),
        (with_container(env=[{"name": "DDPJOB_CHECKPOINT_DIR", "value": "/x"}]),
         "spec.template.spec.containers[0].env[0].name", "DDPJOB_CHECKPOINT_DIR"),
        (with_container(env=[{"name": "TORCHELASTIC_ERROR_FILE", "value": "/x"}]),
         "spec.template.spec.containers[0].env[0].name", "TORCHELASTIC_ERROR_FILE"),
        (with_container(volumeMounts=[{"name": "data", "mountPath": "/checkpoints/"}]),
         "spec.template.spec.containers[0].volumeMounts[0].mountPath", "mount this volume elsewhere"),
        (make_job().with_spec(nprocPerNode="gpu").obj(), "spec.nprocPerNode", "requests no GPU"),
        (make_job().with_checkpoint(mountPath="/").obj(), "spec.checkpoint.mountPath", "system or image directory"),
        (make_job().with_checkpoint(mountPath="/opt/venv/ckpt").obj(), "spec.checkpoint.mountPath", "image"),
    ],
)
def test_templates_that_could_only_fail_at_container_start_are_refused(job: dict[str, Any], field: str,
                                                                        words: str) -> None:
    with pytest.raises(InvalidSpec) as err:
        parse_ddpjob(job)
    assert err.value.field == field and words in err.value.message


def test_template_volume_named_checkpoints_is_refused() -> None:
    job = make_job().obj()
    job["spec"]["template"]["spec"]["volumes"] = [{"name": "checkpoints", "emptyDir": {}}]
    with pytest.raises(InvalidSpec) as err:
        parse_ddpjob(job)
    assert err.value.field == "spec.template.spec.volumes[0].name"


@pytest.mark.parametrize("ok", [
    with_container(env=[{"name": "DDPJOB_DNS_WAIT_SECONDS", "value": "30"}, {"name": "NCCL_DEBUG", "value": "INFO"}]),
    with_container(env=[{"name": "DDPJOB_WARM_TRAINERS", "value": "0"}]),
    with_container(resources={"limits": {"nvidia.com/gpu": 1}}),
])
def test_user_knobs_and_gpu_limits_are_accepted(ok: dict[str, Any]) -> None:
    if ok["spec"]["template"]["spec"]["containers"][0].get("resources"):
        ok["spec"]["nprocPerNode"] = "gpu"
    parse_ddpjob(ok)

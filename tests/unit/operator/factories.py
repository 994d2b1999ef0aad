"""Fluent test factories for DDPJobs and pods, and a tiny in-memory cluster that applies plans."""

from __future__ import annotations

import copy
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

from ddpjob_operator.api import names
from ddpjob_operator.api.formats import format_time
from ddpjob_operator.api.spec import parse_ddpjob
from ddpjob_operator.planner.children import builders
from ddpjob_operator.planner.observation import ChildView, PodView
from ddpjob_operator.planner.plan import Observed, Plan, plan
from ddpjob_worker.restart_request import RESTART_ANNOTATION

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
Obj = dict[str, Any]


def at(seconds: float) -> datetime:
    """T0 plus ``seconds``."""
    return T0 + timedelta(seconds=seconds)


class JobBuilder:
    """``make_job(replicas=4).with_elastic(2, 4).with_run_policy(backoffLimit=1).obj()``."""

    def __init__(self, name: str, namespace: str, replicas: int) -> None:
        self.body: Obj = {
            "apiVersion": "ddpjob.io/v1alpha1",
            "kind": "DDPJob",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": f"uid-{name}",
                "generation": 1,
                "creationTimestamp": format_time(T0),
            },
            "spec": {
                "replicas": replicas,
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "worker",
                                "image": "ddpjob-worker:dev",
                                "args": ["python", "-m", "ddpjob_worker.examples.charlm"],
                            }
                        ]
                    }
                },
            },
        }

    def with_elastic(self, lo: int, hi: int) -> JobBuilder:
        self.body["spec"]["elastic"] = {"minReplicas": lo, "maxReplicas": hi}
        return self

    def with_replicas(self, n: int) -> JobBuilder:
        self.body["spec"]["replicas"] = n
        return self

    def with_run_policy(self, **policy: Any) -> JobBuilder:
        self.body["spec"].setdefault("runPolicy", {}).update(policy)
        return self

    def with_checkpoint(self, **ckpt: Any) -> JobBuilder:
        self.body["spec"]["checkpoint"] = ckpt
        return self

    def with_spec(self, **fields: Any) -> JobBuilder:
        self.body["spec"].update(fields)
        return self

    def with_status(self, **status: Any) -> JobBuilder:
        self.body.setdefault("status", {}).update(status)
        return self

    def obj(self) -> Obj:
        return copy.deepcopy(self.body)


def make_job(name: str = "job", namespace: str = "ns", replicas: int = 2) -> JobBuilder:
    return JobBuilder(name, namespace, replicas)


_uids = itertools.count(1)


def pod_obj(job: Obj, index: int | None, phase: str = "Running", **kw: Any) -> Obj:
    """A raw pod as the API server would return it: built by the real builder, then given a status."""
    parsed = parse_ddpjob(job)
    raw = (
        builders.build_rendezvous_pod(parsed)
        if index is None
        else builders.build_worker_pod(parsed, index, generation=kw.get("generation", 0))
    )
    raw["metadata"]["uid"] = kw.get("uid") or f"pod-{next(_uids)}"
    raw["metadata"]["creationTimestamp"] = format_time(kw.get("created", T0))
    raw["metadata"]["ownerReferences"] = [builders.owner_reference(kw.get("owner") or job)]
    if kw.get("deleting") is not None:
        raw["metadata"]["deletionTimestamp"] = format_time(kw["deleting"])
    raw["spec"]["nodeName"] = kw.get("node", "node-1")
    status: Obj = {"phase": phase}
    if phase == "Running":
        status["conditions"] = [{"type": "Ready", "status": "True"}]
        started = format_time(kw.get("started", T0))
        status["containerStatuses"] = [{"name": "worker" if index is not None else "rendezvous",
                                        "state": {"running": {"startedAt": started}}}]
    if kw.get("reason"):
        status["reason"] = kw["reason"]
    if phase in ("Failed", "Succeeded"):
        term: Obj = {"exitCode": kw.get("exit_code", 0 if phase == "Succeeded" else 1)}
        term["finishedAt"] = format_time(kw.get("finished", T0))
        if kw.get("message"):
            term["message"] = kw["message"]
        term["reason"] = "Completed" if phase == "Succeeded" else "Error"
        status["containerStatuses"] = [
            {"name": "worker" if index is not None else "rendezvous", "state": {"terminated": term}}
        ]
    raw["status"] = status
    return raw


def views(*raw: Obj) -> list[PodView]:
    return [PodView.from_pod(p) for p in raw]


class FakeCluster:
    """Applies plans the way kube/client.py would (409 on an existing name, UID-checked deletes)."""

    def __init__(self, job: Obj) -> None:
        self.job: Obj | None = job
        self.pods: dict[str, Obj] = {}
        self.children: dict[tuple[str, str], Obj] = {}
        self.tombstones: list[PodView] = []
        self.problems: dict[tuple[str, str], Any] = {}
        self.deleted_by_plan: set[str] = set()
        self.created = 0
        self.statuses_written = 0
        self.events: list[tuple[str, str, str]] = []
        self.node_ready: dict[str, bool] = {"node-1": True}

    def observed(self, floor: int = 0) -> Observed:
        # routine_wait 0: a scenario's routine status changes are written at once (status_writes has its own tests)
        return Observed(pods=[*views(*self.pods.values()), *self.tombstones], node_ready=self.node_ready,
                        restarts_floor=floor, problems=dict(self.problems), routine_wait=0.0,
                        deleted=frozenset(self.deleted_by_plan),
                        children={k: ChildView.from_object(v, k[0]) for k, v in self.children.items()})

    def plan(self, now: datetime) -> Plan:
        assert self.job is not None
        return plan(self.job, self.observed(), now)

    def apply(self, p: Plan, *, crash_after_creates: int | None = None, write_status: bool = True) -> None:
        """Apply children, deletes, creates (optionally crash after N), status, events."""
        for obj in p.ensure:
            key = (obj["kind"], obj["metadata"]["name"])
            if key in self.children:
                continue
            child = copy.deepcopy(obj)
            child["metadata"]["uid"] = f"child-{next(_uids)}"
            retained = obj["kind"] == "PersistentVolumeClaim" and \
                (self.jobobj["spec"].get("checkpoint") or {}).get("retainOnDelete", True)
            if not retained:
                child["metadata"]["ownerReferences"] = [builders.owner_reference(self.jobobj)]
            self.children[key] = child
        for d in p.delete_pods:
            pod = self.pods.get(d.name)
            if pod is None or pod["metadata"]["uid"] != d.uid:
                continue
            self.deleted_by_plan.add(d.uid)  # the controller never treats its own deletions as losses
            if d.force or pod["status"]["phase"] in ("Failed", "Succeeded"):
                del self.pods[d.name]
            else:
                pod["metadata"]["deletionTimestamp"] = format_time(T0)
        for target, text in p.annotate_pods:  # the UID in the patch is a precondition
            pod = self.pods.get(target.name)
            if pod is not None and pod["metadata"]["uid"] == target.uid:
                pod["metadata"].setdefault("annotations", {})[RESTART_ANNOTATION] = text
        for n, pod in enumerate(p.create_pods):
            if crash_after_creates is not None and n >= crash_after_creates:
                return
            name = pod["metadata"]["name"]
            if name in self.pods:
                continue  # 409 AlreadyExists == success
            new = copy.deepcopy(pod)
            new["metadata"]["uid"] = f"pod-{next(_uids)}"
            new["metadata"]["ownerReferences"] = [builders.owner_reference(self.jobobj)]
            new["metadata"]["creationTimestamp"] = format_time(T0)
            new["status"] = {"phase": "Pending"}
            self.pods[name] = new
            self.created += 1
        if write_status and p.patch and self.job is not None:
            status = self.job.setdefault("status", {})
            for k, v in p.patch.items():
                if v is None:
                    status.pop(k, None)
                else:
                    status[k] = copy.deepcopy(v)
            self.statuses_written += 1
        self.events.extend((e.type, e.reason, e.message) for e in p.events)
        if p.delete_job:
            self.job = None

    def step(self, now: datetime, **kw: Any) -> Plan:
        p = self.plan(now)
        self.apply(p, **kw)
        return p

    def converge(self, now: datetime, passes: int = 5) -> None:
        for _ in range(passes):
            self.step(now)

    def set_phase(self, name: str, phase: str, **kw: Any) -> None:
        assert self.job is not None
        pod = self.pods[name]
        labels = pod["metadata"]["labels"]
        idx = labels.get(names.LABEL_REPLICA_INDEX)
        fresh = pod_obj(
            self.job,
            int(idx) if idx is not None else None,
            phase,
            uid=pod["metadata"]["uid"],
            generation=int(labels.get(names.LABEL_RESTART_GENERATION, "0")),
            **kw,
        )
        fresh["metadata"]["labels"] = labels
        pod["status"] = fresh["status"]
        pod["spec"]["nodeName"] = kw.get("node", "node-1")

    def user_delete(self, name: str, *, force: bool = False, at: datetime = T0) -> None:
        """Someone else deletes a pod: Terminating (graceful), or gone at once leaving a tombstone (force)."""
        pod = self.pods[name]
        if force:
            del self.pods[name]
            self.tombstones.append(PodView.from_pod(pod).as_gone(at))
        else:
            pod["metadata"]["deletionTimestamp"] = format_time(at)

    def finish_terminations(self) -> None:
        """The kubelet confirms every graceful deletion."""
        gone = [v for v in self.pods.values() if "deletionTimestamp" in v["metadata"]
                and v["metadata"]["uid"] not in self.deleted_by_plan]
        self.pods = {k: v for k, v in self.pods.items() if "deletionTimestamp" not in v["metadata"]}
        self.tombstones += [PodView.from_pod(v).as_gone(T0) for v in gone]

    def run_all(self, started: datetime = T0) -> None:
        """Every pod Running; containers that were not running yet started at ``started``."""
        for name, pod in self.pods.items():
            was = PodView.from_pod(pod).started_at
            self.set_phase(name, "Running", started=was or started)

    @property
    def jobobj(self) -> Obj:
        assert self.job is not None
        return self.job

    @property
    def status(self) -> Obj:
        assert self.job is not None
        return self.job.get("status") or {}

    def worker_names(self) -> list[str]:
        return sorted(n for n in self.pods if "-worker-" in n)


def running_cluster(replicas: int = 2, **policy: Any) -> FakeCluster:
    """A job with ``replicas`` workers and its store all Running, after the passes that got it there."""
    job = make_job(replicas=replicas)
    if policy:
        job.with_run_policy(**policy)
    c = FakeCluster(job.obj())
    c.converge(at(0))
    c.run_all()
    c.converge(at(1))
    return c

"""The child cache's resync: LIST items arrive as views (page by page), the cache keeps what is newer."""

from __future__ import annotations

import copy
from typing import Any

from ddpjob_operator.runtime.cache import ChildCache, listed

from .factories import make_job, pod_obj


def _with_rv(obj: dict[str, Any], rv: str) -> dict[str, Any]:
    obj["metadata"]["resourceVersion"] = rv  # opaque: the cache never orders them
    return obj


def test_listed_keeps_only_labelled_items_as_views() -> None:
    job = make_job().obj()
    pod = pod_obj(job, 0)
    key, view = listed("Pod", pod) or (None, None)
    assert key == ("ns", "job") and view is not None and view.name == pod["metadata"]["name"]
    assert listed("Service", {"metadata": {"name": "other", "namespace": "ns"}}) is None


def test_resync_buries_what_the_list_lacks_and_keeps_what_a_watch_saw_later() -> None:
    job = make_job().obj()
    gone, later, fresh = (_with_rv(pod_obj(job, i), rv) for i, rv in ((0, "zz"), (1, "aa"), (2, "m")))
    cache = ChildCache(clock=lambda: 0.0)
    cache.apply("Pod", "ADDED", gone)
    mark = cache.mark()  # the LIST is sent now
    cache.apply("Pod", "ADDED", later)  # seen by a watch after the LIST was sent
    items = [v for v in (listed("Pod", fresh),) if v is not None]
    changed = cache.resync("Pod", items, mark, scope=["ns"])
    assert changed == {("ns", "job")}
    by_name = {p.name: p for p in cache.pods(("ns", "job"))}
    assert by_name[gone["metadata"]["name"]].gone, "deleted while no watch told us: a tombstone"
    assert not by_name[later["metadata"]["name"]].gone
    assert not by_name[fresh["metadata"]["name"]].gone


def test_a_list_item_replaces_a_version_seen_before_the_list_but_not_one_seen_after() -> None:
    job = make_job().obj()
    before, after = _with_rv(pod_obj(job, 0), "b"), _with_rv(pod_obj(job, 1), "b")
    cache = ChildCache(clock=lambda: 0.0)
    cache.apply("Pod", "ADDED", before)
    mark = cache.mark()
    cache.apply("Pod", "MODIFIED", _with_rv(copy.deepcopy(after), "c"))  # after the LIST was sent: newer
    listed_before, listed_after = copy.deepcopy(before), copy.deepcopy(after)
    listed_before["status"]["phase"] = listed_after["status"]["phase"] = "Failed"
    items = [v for v in (listed("Pod", _with_rv(listed_before, "a")), listed("Pod", _with_rv(listed_after, "a")))
             if v is not None]
    cache.resync("Pod", items, mark, scope=["ns"])
    phases = {p.name: p.phase for p in cache.pods(("ns", "job"))}
    assert phases == {before["metadata"]["name"]: "Failed", after["metadata"]["name"]: "Running"}


def test_a_child_deleted_after_the_list_was_sent_does_not_come_back() -> None:
    child = {"metadata": {"name": "job", "namespace": "ns", "uid": "s1", "resourceVersion": "q",
                          "labels": {"ddpjob.io/job-name": "job"}}}
    cache = ChildCache()
    cache.apply("Service", "ADDED", child)
    mark = cache.mark()
    cache.apply("Service", "DELETED", child)
    items = [v for v in (listed("Service", child),) if v is not None]
    cache.resync("Service", items, mark)
    assert cache.children(("ns", "job")) == {}


def test_resync_replaces_children_of_the_listed_kind_only() -> None:
    def child(name: str, uid: str, rv: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": rv,
                             "labels": {"ddpjob.io/job-name": "job"}}}

    cache = ChildCache()
    cache.apply("Service", "ADDED", child("job", "s1", "x3"))
    cache.apply("Role", "ADDED", child("job-worker", "r1", "x3"))
    items = [v for v in (listed("Service", child("job", "s2", "x8")),) if v is not None]
    assert cache.resync("Service", items, cache.mark()) == {("ns", "job")}
    kids = cache.children(("ns", "job"))
    assert kids[("Service", "job")].uid == "s2", "recreated while no watch told us"
    assert ("Role", "job-worker") in kids, "a LIST of Services says nothing about Roles"


def test_late_deleted_events_of_a_forgotten_job_leave_nothing_behind() -> None:
    """Issue 23 #2: a DELETED event arriving after the job was forgotten re-created its entries, never dropped."""
    job = make_job("gone").obj()
    pod, service = pod_obj(job, 0), {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "gone", "namespace": "ns", "uid": "svc-1", "resourceVersion": "3",
                     "labels": {"ddpjob.io/job-name": "gone"},
                     "ownerReferences": [{"kind": "DDPJob", "name": "gone", "uid": "uid-gone", "controller": True}]}}
    cache = ChildCache()
    cache.apply("Pod", "ADDED", pod)
    cache.apply("Service", "ADDED", service)
    key = ("ns", "gone")
    assert cache.children(key) and cache.pods(key)
    cache.forget(key)
    cache.apply("Pod", "DELETED", pod)
    cache.apply("Service", "DELETED", service)
    assert key not in cache._pods and key not in cache._children
    assert [p.gone for p in cache.pods(key)] == [True]  # only the tombstone, which expires


def test_an_event_that_changes_nothing_the_planner_reads_asks_for_no_pass() -> None:
    """Issue 46: a pod or child rewritten as it was (kwok rewrites its pods' status; a label of someone else's)
    names no job to pass; a change of what the planner reads, a new object and a deletion do. The cache keeps the
    newest version either way."""
    job = make_job().obj()
    key = ("ns", "job")
    pod = _with_rv(pod_obj(job, 0), "1")
    cache = ChildCache(clock=lambda: 0.0)
    assert cache.apply("Pod", "ADDED", pod) == key
    again = _with_rv(copy.deepcopy(pod), "2")
    again["metadata"].setdefault("labels", {})["someone"] = "else"
    assert cache.apply("Pod", "MODIFIED", again) is None
    assert cache.pods(key)[0].resource_version == "2"
    failed = _with_rv(copy.deepcopy(again), "3")
    failed["status"]["phase"] = "Failed"
    assert cache.apply("Pod", "MODIFIED", failed) == key
    assert cache.apply("Pod", "DELETED", failed) == key
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": "job", "namespace": "ns", "uid": "s", "resourceVersion": "1", "labels": {"ddpjob.io/job-name": "job"}}}
    assert cache.apply("Service", "ADDED", svc) == key
    assert cache.apply("Service", "MODIFIED", _with_rv(copy.deepcopy(svc), "2")) is None

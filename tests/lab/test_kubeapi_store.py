"""The fake API's store read paths for controllers (deploy/lab/kubeapi/store.py), in process:
scan and peek share the stored objects, which a write replaces and never changes; clients'
reads stay copies; the owner index follows creates, updates, deletes and a reload; the
store-driven controllers are skipped only while nothing changed since a pass that wrote none;
the namespace, label and node indexes answer as a full scan would, and a PodDisruptionBudget
found through them still refuses an eviction it does not allow (429, the real Status body)."""

from __future__ import annotations

import sys

import pytest

from tests.lab.fixture import REPO

sys.path.insert(0, str(REPO / "deploy" / "lab"))
from kubeapi import controllers, policy
from kubeapi.cluster import Cluster, Timing, set_ready
from kubeapi.errors import ApiError
from kubeapi.resources import by_kind
from kubeapi.seed import seed
from kubeapi.selectors import field_matcher, label_matcher
from kubeapi.server import narrowed
from kubeapi.store import Store, meta

PODS, RS, PDBS = by_kind("Pod"), by_kind("ReplicaSet"), by_kind("PodDisruptionBudget")


@pytest.fixture
def cluster() -> Cluster:
    found = Cluster(Store(), Timing())
    seed(found, ["gpu05", "gpu06"], "550.54.15")
    return found


def serving(cluster: Cluster) -> tuple[str, list[str]]:
    """The serving ReplicaSet's uid and its pods' names, found the copying way."""
    rs = cluster.store.select(RS, "serving")[0][0]
    uid = meta(rs)["uid"]
    pods = cluster.store.select(PODS, "serving", lambda p: any(
        r["uid"] == uid for r in meta(p).get("ownerReferences") or []))[0]
    return uid, sorted(meta(p)["name"] for p in pods)


def test_scan_shares_what_a_write_replaces_and_select_copies(cluster: Cluster) -> None:
    store = cluster.store
    shared = store.scan(PODS, "serving")[0]
    name = meta(shared)["name"]
    assert store.peek(PODS, "serving", name) is shared
    assert store.select(PODS, "serving")[0][0] is not shared
    assert store.get(PODS, "serving", name) == shared
    before = meta(shared)["resourceVersion"]
    store.modify(PODS, "serving", name, lambda p: meta(p)["labels"].update(extra="1"))
    assert "extra" not in meta(shared)["labels"] and meta(shared)["resourceVersion"] == before
    now = store.peek(PODS, "serving", name)
    assert now is not None and meta(now)["labels"]["extra"] == "1"
    store.delete(PODS, "serving", name)
    assert meta(shared)["resourceVersion"] == before  # the deleted copy got the new one
    assert store.peek(PODS, "serving", name) is None


def test_owner_index_follows_writes_and_a_reload(cluster: Cluster) -> None:
    store = cluster.store
    uid, names = serving(cluster)
    assert [meta(p)["name"] for p in store.scan_owned(PODS, "serving", uid)] == names
    assert store.scan_owned(PODS, "default", uid) == []
    orphan, gone = names[0], names[1]
    def disown(pod: dict[str, object]) -> None:
        meta(pod).pop("ownerReferences")
    store.modify(PODS, "serving", orphan, disown)
    store.delete(PODS, "serving", gone)
    left = [meta(p)["name"] for p in store.scan_owned(PODS, "serving", uid)]
    assert left == names[2:] == serving(cluster)[1]
    reloaded = Store()
    reloaded.load(store.snapshot())
    assert [meta(p)["name"] for p in reloaded.scan_owned(PODS, "serving", uid)] == left


def test_reconcile_skips_only_after_a_quiet_pass(cluster: Cluster) -> None:
    store = cluster.store
    quiet = controllers.reconcile(cluster, None)
    while quiet is None:  # the seeded pool's first passes write statuses
        quiet = controllers.reconcile(cluster, None)
    assert quiet == store.current_rv()
    assert controllers.reconcile(cluster, quiet) == quiet
    _, names = serving(cluster)
    store.delete(PODS, "serving", names[0])
    assert controllers.reconcile(cluster, quiet) is None  # recreated the pod: wrote
    assert len(serving(cluster)[1]) == len(names)


def ready_pod(cluster: Cluster, name: str, node: str, app: str) -> None:
    cluster.create_pod({"metadata": {"name": name, "namespace": "default",
                                     "labels": {"app": app}},
                        "spec": {"nodeName": node, "containers": [{"name": "c"}]}})
    cluster.store.modify(PODS, "default", name, set_ready)


def listed(store: Store, query: dict[str, str], ns: str | None = None) -> list[str]:
    """A list as the server answers it (through the indexes), checked against a full scan."""
    labels = label_matcher(query.get("labelSelector"))
    fields = field_matcher(query.get("fieldSelector"), "Pod")
    def match(obj: dict[str, object]) -> bool:
        return labels(meta(obj).get("labels") or {}) and fields(obj)
    fast = [meta(p)["name"] for p in store.select(PODS, ns, match, narrowed(query))[0]]
    assert fast == [meta(p)["name"] for p in store.select(PODS, ns, match)[0]]
    return fast


def test_indexes_answer_as_a_full_scan_through_writes_and_a_reload(cluster: Cluster) -> None:
    store = cluster.store
    for i, node in enumerate(["gpu05", "gpu05", "gpu06"]):
        ready_pod(cluster, f"web-{i}", node, "web")
    on_05 = {"fieldSelector": "spec.nodeName=gpu05"}
    assert {"web-0", "web-1"} <= set(listed(store, on_05))
    assert listed(store, {"labelSelector": "app=web"}, "default") == ["web-0", "web-1", "web-2"]
    assert listed(store, {"labelSelector": "app==web,app!=db", **on_05}) == ["web-0", "web-1"]
    assert listed(store, {"fieldSelector": "spec.nodeName="}) == listed(store, {}, "nowhere")
    store.modify(PODS, "default", "web-0", lambda p: meta(p)["labels"].update(app="db"))
    store.delete(PODS, "default", "web-1")
    assert listed(store, {"labelSelector": "app=web", **on_05}) == []
    assert listed(store, {"labelSelector": "app=db"}) == ["web-0"]
    reloaded = Store()
    reloaded.load(store.snapshot())
    assert listed(reloaded, {"labelSelector": "app=web"}, "default") == ["web-2"]


def test_a_budget_found_through_the_indexes_still_refuses_an_eviction(
        cluster: Cluster) -> None:
    store = cluster.store
    for i in range(4):
        ready_pod(cluster, f"train-{i}", "gpu05" if i < 2 else "gpu06", "train")
    store.create(PDBS, "default", {"metadata": {"name": "train"}, "spec": {
        "maxUnavailable": 1, "selector": {"matchLabels": {"app": "train"}}}})
    def evict(name: str) -> dict[str, object]:
        return policy.evict(store, "default", name, {}, False, cluster.delete_pod)
    assert evict("train-0")["code"] == 201
    with pytest.raises(ApiError) as refused:
        evict("train-1")
    body = refused.value.body()
    assert (refused.value.code, body["reason"]) == (429, "TooManyRequests")
    assert body["message"] == ("Cannot evict pod as it would violate the pod's disruption "
                               "budget.")
    assert body["details"]["causes"] == [{"reason": "DisruptionBudget", "message":
        "The disruption budget train needs 3 healthy pods and has 3 currently"}]
    pdb = store.peek(PDBS, "default", "train")
    assert pdb is not None
    status = pdb["status"]
    assert (status["disruptionsAllowed"], status["expectedPods"]) == (0, 4)
    # a pod relabelled out of the budget's selector leaves its index entry: not counted
    store.modify(PODS, "default", "train-3", lambda p: meta(p)["labels"].update(app="x"))
    with pytest.raises(ApiError):
        evict("train-1")  # 2 healthy of 3 expected: still none allowed
    store.delete(PODS, "default", "train-0")  # the evicted pod went: one disruption free
    assert evict("train-1")["code"] == 201

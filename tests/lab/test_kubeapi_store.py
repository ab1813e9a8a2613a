"""The fake API's store read paths for controllers (deploy/lab/kubeapi/store.py), in process:
scan and peek share the stored objects, which a write replaces and never changes; clients'
reads stay copies; the owner index follows creates, updates, deletes and a reload; the
store-driven controllers are skipped only while nothing changed since a pass that wrote none."""

from __future__ import annotations

import sys

import pytest

from tests.lab.fixture import REPO

sys.path.insert(0, str(REPO / "deploy" / "lab"))
from kubeapi import controllers
from kubeapi.cluster import Cluster, Timing
from kubeapi.resources import by_kind
from kubeapi.seed import seed
from kubeapi.store import Store, meta

PODS, RS = by_kind("Pod"), by_kind("ReplicaSet")


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

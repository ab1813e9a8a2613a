"""The lab's reboot agent (deploy/lab/kubeapi/reboot.py) in process, on a seeded cluster and a
fake wall clock: the label makes the node NotReady, then Ready on a new bootID with new
validator pods; one reboot per label value; `reboot=hang` ignores the label; a removed label
forgets the request (a node half down comes back)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.lab.fixture import REPO

sys.path.insert(0, str(REPO / "deploy" / "lab"))
from kubeapi import reboot
from kubeapi.cluster import Cluster, Timing
from kubeapi.resources import by_kind
from kubeapi.seed import seed
from kubeapi.store import Store, meta

NODES, PODS = by_kind("Node"), by_kind("Pod")


class Wall:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def time(self) -> float:
        return self.now


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Cluster, Wall]:
    wall = Wall()
    monkeypatch.setattr(reboot, "time", SimpleNamespace(time=wall.time))
    found = Cluster(Store(), Timing(), faults_dir=tmp_path)
    seed(found, ["gpu06"], "550.54.15")
    return found, wall


def node(cluster: Cluster) -> tuple[bool, str, dict[str, str]]:
    obj = cluster.store.find(NODES, "", "gpu06")
    assert obj is not None
    ready = any(c["type"] == "Ready" and c["status"] == "True"
                for c in obj["status"]["conditions"])
    return ready, obj["status"]["nodeInfo"]["bootID"], meta(obj).get("labels") or {}


def label(cluster: Cluster, value: str | None) -> None:
    def change(obj: dict[str, object]) -> None:
        labels = meta(obj).setdefault("labels", {})
        if value is None:
            labels.pop(reboot.LABEL, None)
        else:
            labels[reboot.LABEL] = value
    cluster.store.modify(NODES, "", "gpu06", change)


def validators(cluster: Cluster) -> list[str]:
    return [meta(p)["uid"] for p in cluster.store.select(PODS, "gpu-operator")[0]
            if meta(p)["name"].startswith(reboot.VALIDATOR_PREFIX)
            and p["spec"].get("nodeName") == "gpu06"]


def tick_after(cluster: Cluster, wall: Wall, seconds: float) -> None:
    wall.now += seconds
    reboot.tick(cluster)


def test_a_labelled_node_goes_down_and_comes_back_on_a_new_boot_id(
        cluster: tuple[Cluster, Wall]) -> None:
    found, wall = cluster
    ready, boot, _ = node(found)
    assert ready and boot
    before = validators(found)
    label(found, "100")
    tick_after(found, wall, 0)
    assert node(found)[:2] == (True, boot)  # not at once
    tick_after(found, wall, 1.1)
    assert node(found)[:2] == (False, boot)
    tick_after(found, wall, 1.1)
    ready, new_boot, labels = node(found)
    assert ready and new_boot != boot and labels[reboot.LABEL] == "100"
    assert before and not set(validators(found)) & set(before)  # they start again
    tick_after(found, wall, 5)
    assert node(found)[1] == new_boot  # one reboot per label value
    label(found, None)
    tick_after(found, wall, 0.1)
    obj = found.store.find(NODES, "", "gpu06")
    assert obj is not None and reboot.STATE not in (meta(obj).get("annotations") or {})


def test_the_hang_fault_ignores_the_label(cluster: tuple[Cluster, Wall],
                                          tmp_path: Path) -> None:
    found, wall = cluster
    faults = tmp_path / "gpu06.json"
    faults.write_text(json.dumps(json.loads(faults.read_text()) | {"reboot": "hang"}))
    _, boot, _ = node(found)
    label(found, "100")
    for _ in range(5):
        tick_after(found, wall, 1.1)
    assert node(found)[:2] == (True, boot)


def test_a_request_withdrawn_mid_reboot_brings_the_node_back(
        cluster: tuple[Cluster, Wall]) -> None:
    found, wall = cluster
    _, boot, _ = node(found)
    label(found, "100")
    tick_after(found, wall, 0)
    tick_after(found, wall, 1.1)
    assert not node(found)[0]
    label(found, None)
    tick_after(found, wall, 0.1)
    ready, new_boot, _ = node(found)
    assert ready and new_boot != boot

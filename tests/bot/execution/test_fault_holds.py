"""A node a run found faulty stays out in both pools: as the run ends, its Kubernetes cordon
is marked as a failed check when Slurm keeps the node for this run's failed check, whoever
cordoned it, and only then (another run's check or a plain drain are left)."""

from __future__ import annotations

import threading

import pytest

from adapters.kubernetes import cordons
from adapters.kubernetes.cordons import CORDONED_BY, FAILED_CHECK
from adapters.kubernetes.fake import FakeKubernetes
from adapters.slurm.fake import FakeSlurm
from bot.execution import fault_holds
from bot.runbooks.params import Inventory

NODES = ["gpu05", "gpu06", "gpu07", "gpu08"]
BOTH = Inventory(nodes=frozenset(NODES), slurm=frozenset(NODES), kubernetes=frozenset(NODES))


def systems() -> tuple[FakeSlurm, FakeKubernetes]:
    slurm = FakeSlurm(NODES)
    slurm.update_nodes(["gpu05"], "DRAIN", "health check failed: Fail (execution 7: failed check)")
    slurm.update_nodes(["gpu06"], "DRAIN", "XID 94 (execution 7)")
    slurm.update_nodes(["gpu07"], "DRAIN", "health check failed (execution 6: failed check)")
    slurm.update_nodes(["gpu08"], "DRAIN", "health check failed (execution 7: failed check)")
    kube = FakeKubernetes(NODES)
    for node, owner in (("gpu05", "execution-7"), ("gpu06", "execution-7"),
                        ("gpu07", "execution-7"), ("gpu08", "window-2")):
        kube.patch_node(node, {"spec": {"unschedulable": True},
                               "metadata": {"annotations": {CORDONED_BY: owner}}},
                        strategic=True)
    return slurm, kube


def test_only_this_runs_failed_check_is_carried_to_its_own_cordon() -> None:
    slurm, kube = systems()
    said = fault_holds.carry_over({"slurm": slurm, "kubernetes": kube}, BOTH, NODES, 7)
    assert said == "gpu05, gpu08 kept cordoned in Kubernetes for the failed check"
    assert kube.nodes["gpu05"].annotations[FAILED_CHECK] == (
        "Slurm kept it out: health check failed: Fail (execution-7)")
    assert [n for n in NODES if FAILED_CHECK in kube.nodes[n].annotations] == ["gpu05", "gpu08"]
    assert kube.nodes["gpu08"].annotations[CORDONED_BY] == "window-2"  # the owner stays
    assert "gpu05" in cordons.not_liftable(kube.nodes.values())


def test_nodes_in_one_pool_only_or_no_kubernetes_are_left_alone() -> None:
    slurm, kube = systems()
    slurm_only = Inventory(nodes=frozenset(NODES), slurm=frozenset(NODES))
    assert fault_holds.carry_over({"slurm": slurm, "kubernetes": kube}, slurm_only, NODES,
                                  7) == ""
    assert fault_holds.carry_over({"slurm": slurm}, BOTH, NODES, 7) == ""
    assert not any(FAILED_CHECK in n.annotations for n in kube.nodes.values())


def test_a_hung_slurm_is_said_within_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    slurm, kube = systems()
    hung = threading.Event()
    monkeypatch.setattr(slurm, "nodes", lambda *a, **k: hung.wait(30))
    monkeypatch.setattr(fault_holds, "READ_SECONDS", 0.2)
    said = fault_holds.carry_over({"slurm": slurm, "kubernetes": kube}, BOTH, ["gpu05"], 7)
    hung.set()
    assert said == ("the Kubernetes cordons of gpu05 could not be checked in 0.2 s: look at "
                    "them before uncordoning")

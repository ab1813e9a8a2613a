"""The capacity guard told which pool gives the node (``capacity: {pool: ...}``, handoff-node):
only that pool is counted, with its site floor; a Kubernetes node labelled as serving Slurm
is no free capacity of the Kubernetes pool, even when nobody cordoned it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from adapters.kubernetes.fake import FakeKubernetes
from adapters.slurm.fake import FakeSlurm
from bot.config import InventoryConfig, PoolFloors
from bot.config_remediation import PoolsConfig
from bot.execution.checks.capacity import CapacityEvaluator
from bot.execution.planning import PlannedCheck
from bot.runbooks.inventory import InventorySources, Seen, build

POOL = PoolsConfig().label


def check(**spec: Any) -> PlannedCheck:
    return PlannedCheck("the giving pool keeps enough free GPUs", "capacity",
                        {"capacity": spec}, None, 0, 0, 10)


def systems() -> tuple[FakeSlurm, FakeKubernetes]:
    slurm = FakeSlurm(["gpu01", "gpu02", "gpu03", "gpu04"])  # 8 GPUs each
    kubernetes = FakeKubernetes(["gpu04", "gpu05", "gpu06"])
    for name, node in kubernetes.nodes.items():
        labels = {POOL: "slurm"} if name == "gpu04" else {}
        kubernetes.nodes[name] = replace(node, gpus_allocatable=8, labels=labels)
    return slurm, kubernetes


def evaluator(slurm: FakeSlurm, kubernetes: FakeKubernetes,
              floors: PoolFloors | None = None) -> CapacityEvaluator:
    sources = InventorySources(
        slurm=lambda: [Seen(n.name, drain_reason=n.reason if "DRAIN" in n.flags else None)
                       for n in slurm.nodes(None, with_jobs=False)],
        kubernetes=lambda: [Seen(n.name, pool_label=n.labels.get(POOL))
                            for n in kubernetes.list_nodes()])
    inventory = build(InventoryConfig(), sources)
    return CapacityEvaluator(inventory, slurm, kubernetes, None, site_floors=floors,
                             pools=PoolsConfig())


def test_only_the_named_pool_is_counted() -> None:
    slurm, kubernetes = systems()
    outcome = evaluator(slurm, kubernetes)(check(pool_of="gpu04", pool="slurm",
                                                 min_free_gpus_after=8), 1e12)
    assert outcome.passed and outcome.value == 24
    assert outcome.detail == ("Slurm pool: 32 free GPUs now, 24 after taking gpu04 out "
                              "(floor 8)")
    assert "Kubernetes" not in outcome.extra["pools"]


def test_the_giving_pool_keeps_its_site_floor() -> None:
    slurm, kubernetes = systems()
    outcome = evaluator(slurm, kubernetes, PoolFloors(slurm=30))(
        check(pool_of="gpu04", pool="slurm", min_free_gpus_after=8), 1e12)
    assert not outcome.passed and outcome.extra["below_site_floor"]
    assert "24 after taking gpu04 out (floor 30, the site floor" in outcome.detail


def test_a_node_serving_slurm_is_no_kubernetes_capacity() -> None:
    slurm, kubernetes = systems()  # gpu04 labelled slurm, not cordoned
    outcome = evaluator(slurm, kubernetes)(check(pool_of="gpu05", pool="kubernetes",
                                                 min_free_gpus_after=0), 1e12)
    assert outcome.passed and outcome.extra["pools"]["Kubernetes"] == {
        "now": 16, "after": 8, "site_floor": 0}
    # handing gpu04 back from Kubernetes takes nothing from it while it serves Slurm
    outcome = evaluator(slurm, kubernetes)(check(pool_of="gpu04", pool="kubernetes",
                                                 min_free_gpus_after=16), 1e12)
    assert outcome.passed and outcome.value == 16


def test_a_node_drained_for_kubernetes_is_no_slurm_capacity() -> None:
    slurm, kubernetes = systems()
    slurm.update_nodes(["gpu04"], "DRAIN", "pool: kubernetes (handoff-node)")
    outcome = evaluator(slurm, kubernetes)(check(pool_of="gpu04", pool="slurm",
                                                 min_free_gpus_after=24), 1e12)
    assert outcome.passed and outcome.extra["pools"]["Slurm"]["after"] == 24


def test_a_pool_that_is_not_slurm_or_kubernetes_fails_closed() -> None:
    slurm, kubernetes = systems()
    outcome = evaluator(slurm, kubernetes)(check(pool_of="gpu04", pool="lustre"), 1e12)
    assert not outcome.passed and "pool must be slurm or kubernetes" in outcome.detail
    unconfigured = CapacityEvaluator(evaluator(slurm, kubernetes)._inventory_of, slurm, None)
    outcome = unconfigured(check(pool_of="gpu04", pool="kubernetes"), 1e12)
    assert not outcome.passed
    assert outcome.detail == "gpu04 is in the kubernetes pool: kubernetes is not configured"

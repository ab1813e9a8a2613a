"""The capacity guard told which pool gives the node (``capacity: {pool: ...}``, handoff-node):
only that pool is counted, with its site floor; a Kubernetes node labelled as serving Slurm
is no free capacity of the Kubernetes pool, even when nobody cordoned it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from adapters.kubernetes.backend import KubernetesError, Pod
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
        "now": 16, "after": 8, "site_floor": 0, "counted": ["gpu05"], "already_out": {}}
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


# --- what a set costs: nodes already out, the worst batch, a whole pool ----------------


def test_a_node_already_out_costs_nothing_and_the_detail_says_so() -> None:
    slurm, kubernetes = systems()
    slurm.update_nodes(["gpu02"], "DRAIN", "XID 79")
    slurm.state["gpu03"] = replace(slurm.state["gpu03"], state="down")
    outcome = evaluator(slurm, kubernetes)(check(pool_of="gpu[01-03]", pool="slurm",
                                                 min_free_gpus_after=8), 1e12)
    assert outcome.passed and outcome.extra["pools"]["Slurm"]["counted"] == ["gpu01"]
    assert outcome.detail == ("Slurm pool: 16 free GPUs now, 8 after taking gpu01 out; "
                              "already out, costing nothing: gpu03 (down), gpu02 (drained) "
                              "(floor 8)")


def test_repairing_nodes_already_out_is_never_blocked_by_the_floor() -> None:
    slurm, kubernetes = systems()
    slurm.update_nodes(["gpu01", "gpu02", "gpu03"], "DRAIN", "XID 79")  # 8 free: under 30
    outcome = evaluator(slurm, kubernetes, PoolFloors(slurm=30))(
        check(pool_of="gpu02", pool="slurm", min_free_gpus_after=30), 1e12)
    assert outcome.passed and not outcome.extra["below_site_floor"]
    assert outcome.detail.startswith("Slurm pool: 8 free GPUs now, taking nothing more; "
                                     "already out, costing nothing: gpu02 (drained)")


def test_a_busy_node_in_service_is_counted_even_with_no_free_gpu() -> None:
    slurm, kubernetes = systems()
    slurm.state["gpu01"] = replace(slurm.state["gpu01"], state="allocated", gpus_used=8)
    slurm.update_nodes(["gpu02", "gpu03"], "DRAIN", "XID 79")  # 0 free left in service
    outcome = evaluator(slurm, kubernetes)(check(pool_of="gpu01", pool="slurm",
                                                 min_free_gpus_after=9), 1e12)
    # it takes no free GPU, but the pool is under its floor: nothing more goes out
    assert not outcome.passed and outcome.extra["pools"]["Slurm"]["counted"] == ["gpu01"]
    assert "8 free GPUs now, 8 after taking gpu01 out (floor 9)" in outcome.detail


def test_at_once_counts_the_worst_batch_not_the_whole_set() -> None:
    slurm, kubernetes = systems()
    slurm.state["gpu01"] = replace(slurm.state["gpu01"], state="mixed", gpus_used=6)
    slurm.update_nodes(["gpu04"], "DRAIN", "XID 79")
    guard = evaluator(slurm, kubernetes)
    outcome = guard(check(pool_of="gpu[01-04]", pool="slurm", at_once=2,
                          min_free_gpus_after=2), 1e12)
    # 18 free (2 + 8 + 8); the worst 2 at once are gpu02 and gpu03 (8 each), not gpu01
    assert outcome.passed and outcome.value == 2
    assert outcome.extra["pools"]["Slurm"]["counted"] == ["gpu02", "gpu03"]
    assert outcome.detail == ("Slurm pool: 18 free GPUs now, 2 after taking 2 of "
                              "gpu[01-03] (3 nodes) at once (the worst case: gpu[02-03]) out; "
                              "already out, costing nothing: gpu04 (drained) (floor 2)")
    outcome = guard(check(pool_of="gpu[01-04]", pool="slurm", at_once=2,
                          min_free_gpus_after=3), 1e12)
    assert not outcome.passed
    one = guard(check(pool_of="gpu[01-04]", pool="slurm", at_once=1,
                      min_free_gpus_after=10), 1e12)
    assert one.passed and one.value == 10
    whole = guard(check(pool_of="gpu[01-04]", pool="slurm", min_free_gpus_after=0), 1e12)
    assert whole.value == 0  # without at_once the whole set is out
    for bad in (0, "two"):
        outcome = guard(check(pool_of="gpu01", pool="slurm", at_once=bad), 1e12)
        assert not outcome.passed and "at_once must be" in outcome.detail


def test_whole_pool_counts_every_node_of_the_named_pool() -> None:
    slurm, kubernetes = systems()  # Kubernetes: gpu05 and gpu06 serve it, gpu04 serves Slurm
    guard = evaluator(slurm, kubernetes)
    outcome = guard(check(pool="kubernetes", whole_pool=True, at_once=1,
                          min_free_gpus_after=8), 1e12)
    assert outcome.passed and outcome.extra["pools"]["Kubernetes"]["after"] == 8
    assert outcome.detail == ("Kubernetes pool: 16 free GPUs now, 8 after taking 1 of "
                              "gpu[05-06] (2 nodes) at once (the worst case: gpu05) out "
                              "(floor 8)")
    kubernetes.nodes["gpu06"] = replace(kubernetes.nodes["gpu06"], unschedulable=True)
    outcome = guard(check(pool="kubernetes", whole_pool=True, at_once=1,
                          min_free_gpus_after=8), 1e12)
    assert not outcome.passed and "gpu06 (cordoned)" in outcome.detail
    outcome = guard(check(whole_pool=True, min_free_gpus_after=0), 1e12)
    assert not outcome.passed and outcome.detail == "whole_pool needs pool: slurm or kubernetes"


# --- edges each guard line stands on (a test per mutant of the count) --------------------


def pod(name: str, node: str, gpus: int, **extra: Any) -> Pod:
    return Pod("serving", name, f"uid-{name}", node=node, phase=extra.pop("phase", "Running"),
               gpus_requested=gpus, **extra)


def test_only_pods_that_hold_gpus_count_against_a_node() -> None:
    slurm, kubernetes = systems()  # gpu05 and gpu06 serve Kubernetes, 8 GPUs each
    kubernetes.pods = [pod("a", "gpu05", 2), pod("done", "gpu05", 4, phase="Succeeded"),
                       pod("crashed", "gpu05", 4, phase="Failed"),
                       pod("leaving", "gpu05", 4, deleting=True), pod("b", "gpu06", 8)]
    outcome = evaluator(slurm, kubernetes)(check(pool_of="gpu05", pool="kubernetes",
                                                 min_free_gpus_after=0), 1e12)
    # gpu05: 8 - 2 (finished, failed and terminating pods hold nothing); gpu06: 0 free
    assert outcome.extra["pools"]["Kubernetes"]["now"] == 6
    assert outcome.extra["pools"]["Kubernetes"]["after"] == 0


def test_a_node_whose_jobs_overcommit_it_counts_no_negative_gpus() -> None:
    slurm, kubernetes = systems()
    slurm.state["gpu01"] = replace(slurm.state["gpu01"], state="allocated", gpus_used=12)
    outcome = evaluator(slurm, kubernetes)(check(pool_of="gpu02", pool="slurm",
                                                 min_free_gpus_after=0), 1e12)
    assert outcome.extra["pools"]["Slurm"]["now"] == 24  # 0 + 8 + 8 + 8, never -4


def test_after_equal_to_the_site_floor_passes_one_under_fails() -> None:
    slurm, kubernetes = systems()  # 32 free in Slurm, 24 with one node out
    at_floor = evaluator(slurm, kubernetes, PoolFloors(slurm=24))(
        check(pool_of="gpu01", pool="slurm", min_free_gpus_after=0), 1e12)
    assert at_floor.passed and not at_floor.extra["below_site_floor"]
    under = evaluator(slurm, kubernetes, PoolFloors(slurm=25))(
        check(pool_of="gpu01", pool="slurm", min_free_gpus_after=0), 1e12)
    assert not under.passed and under.extra["below_site_floor"]


def test_a_kubernetes_api_that_fails_fails_the_guard() -> None:
    slurm, kubernetes = systems()

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise KubernetesError("the API server answered 500")

    kubernetes.list_pods = failing  # type: ignore[method-assign]
    outcome = evaluator(slurm, kubernetes)(check(pool_of="gpu05", min_free_gpus_after=0), 1e12)
    assert not outcome.passed
    assert outcome.detail == "cannot count free GPUs: the API server answered 500"

"""The capacity guard told which pool gives the node (``capacity: {pool: ...}``, handoff-node):
only that pool is counted, with its site floor; a Kubernetes node labelled as serving Slurm
is no free capacity of the Kubernetes pool, even when nobody cordoned it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from adapters.kubernetes.backend import KubernetesError, Pod
from adapters.kubernetes.fake import FakeKubernetes
from adapters.slurm.fake import FakeSlurm
from bot.config import InventoryConfig, PoolFloors
from bot.config.remediation import PoolsConfig
from bot.execution.checks.capacity import CapacityEvaluator
from bot.execution.planning import PlannedCheck
from bot.runbooks.inventory import InventorySources, Seen, build
from bot.runbooks.params import Inventory

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


# --- what the guard says, and to whom it listens -------------------------------------------


def test_nodes_out_of_service_are_named_with_why() -> None:
    slurm, kubernetes = systems()
    slurm.state["gpu01"] = replace(slurm.state["gpu01"], flags=frozenset({"NOT_RESPONDING"}))
    slurm.state["gpu02"] = replace(slurm.state["gpu02"], flags=frozenset({"MAINTENANCE"}))
    slurm.state["gpu03"] = replace(slurm.state["gpu03"], flags=frozenset({"RESERVED"}))
    kubernetes.nodes["gpu05"] = replace(kubernetes.nodes["gpu05"], ready=False)
    guard = evaluator(slurm, kubernetes)
    outcome = guard(check(pool_of="gpu[01-03],gpu05", pool="slurm"), 1e12)
    assert outcome.extra["pools"]["Slurm"]["already_out"] == {
        "gpu01": "not responding", "gpu02": "reserved", "gpu03": "reserved",
        "gpu05": "not in service"}  # gpu05 is no Slurm node at all
    assert outcome.extra["floor"] == 0 and "(floor 0)" in outcome.detail
    outcome = guard(check(pool_of="gpu04,gpu05", pool="kubernetes"), 1e12)
    assert outcome.extra["pools"]["Kubernetes"]["already_out"] == {
        "gpu04": "serving Slurm", "gpu05": "not ready"}


def test_a_check_that_cannot_be_read_or_counted_fails_as_false() -> None:
    slurm, kubernetes = systems()
    guard = evaluator(slurm, kubernetes)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"pool_of": "gpu[01"}, "pool_of: hostlist 'gpu[01': '[' is never closed"),
        ({"pool_of": "gpu01", "min_free_gpus_after": "x"},
         "min_free_gpus_after must be a whole number"),
        ({"pool_of": "gpu01", "at_once": "x"}, "at_once must be a whole number"),
        ({"pool_of": "gpu01", "at_once": 0}, "at_once must be at least 1"),
        ({}, " is in no pool the bot can count GPUs of"),
        ({"pool": "slurm", "whole_pool": True},
         "every node of the slurm pool is in the slurm pool: slurm is not configured"),
    ]
    for spec, detail in cases:
        unconfigured = CapacityEvaluator(guard._inventory_of, None, kubernetes)
        outcome = (unconfigured if "whole_pool" in spec else guard)(check(**spec), 1e12)
        assert (outcome.passed, outcome.value, outcome.detail) == (False, None, detail)
    kubernetes.list_pods = lambda *a, **k: (_ for _ in ()).throw(  # type: ignore[method-assign]
        KubernetesError("500"))
    outcome = guard(check(pool_of="gpu05"), 1e12)
    assert (outcome.passed, outcome.detail) == (False, "cannot count free GPUs: 500")


def test_whole_pool_of_slurm_and_an_empty_at_once() -> None:
    slurm, kubernetes = systems()
    outcome = evaluator(slurm, kubernetes)(check(pool="slurm", whole_pool=True, at_once=""),
                                           1e12)
    assert outcome.extra["pools"]["Slurm"]["counted"] == ["gpu01", "gpu02", "gpu03", "gpu04"]
    assert outcome.value == 0


def test_a_node_in_both_pools_is_judged_in_each_with_each_site_floor() -> None:
    slurm, kubernetes = systems()
    kubernetes.nodes["gpu04"] = replace(kubernetes.nodes["gpu04"], labels={})
    kubernetes.pods = [pod("a", "gpu05", 2), pod("b", "gpu05", 3)]  # both count on gpu05
    outcome = evaluator(slurm, kubernetes, PoolFloors(slurm=8, kubernetes=5))(
        check(pool_of="gpu04", min_free_gpus_after=8), 1e12)
    assert outcome.passed and outcome.value == 11
    assert outcome.detail == (
        "Slurm pool: 32 free GPUs now, 24 after taking gpu04 out (floor 8); "
        "Kubernetes pool: 19 free GPUs now, 11 after taking gpu04 out (floor 8)")
    strict = evaluator(slurm, kubernetes, PoolFloors(kubernetes=12))(
        check(pool_of="gpu04", min_free_gpus_after=8), 1e12)
    assert not strict.passed and strict.detail.endswith(
        "11 after taking gpu04 out (floor 12, the site floor (guards.min_free_gpus.kubernetes);"
        " the runbook asks for 8)")


def test_at_once_as_large_as_the_nodes_in_service_takes_them_all() -> None:
    slurm, kubernetes = systems()
    slurm.update_nodes(["gpu03"], "DRAIN", "XID 79")
    outcome = evaluator(slurm, kubernetes)(check(pool_of="gpu[01-03]", pool="slurm",
                                                 at_once=2), 1e12)
    assert outcome.detail == ("Slurm pool: 24 free GPUs now, 8 after taking gpu[01-02] "
                              "(2 nodes) out; already out, costing nothing: gpu03 (drained) "
                              "(floor 0)")


def test_nodes_are_counted_by_their_names_in_each_system_and_the_selector() -> None:
    slurm = FakeSlurm(["s-gpu01", "s-gpu02"])
    kubernetes = FakeKubernetes(["k-gpu01", "k-gpu02", "other"])
    for name, node in kubernetes.nodes.items():
        labels = {"gpu": "yes"} if name != "other" else {}
        kubernetes.nodes[name] = replace(node, gpus_allocatable=8, labels=labels)
    inventory = Inventory(frozenset({"gpu01", "gpu02"}), frozenset({"gpu01", "gpu02"}),
                          frozenset({"gpu01", "gpu02"}),
                          {"slurm": {"gpu01": "s-gpu01", "gpu02": "s-gpu02"},
                           "kubernetes": {"gpu01": "k-gpu01", "gpu02": "k-gpu02"}})
    guard = CapacityEvaluator(inventory, slurm, kubernetes, "gpu=yes", pools=PoolsConfig())
    outcome = guard(check(pool_of="gpu01"), 1e12)
    assert outcome.extra["pools"]["Slurm"] == {
        "now": 16, "after": 8, "site_floor": 0, "counted": ["gpu01"], "already_out": {}}
    assert outcome.extra["pools"]["Kubernetes"] == {
        "now": 16, "after": 8, "site_floor": 0, "counted": ["gpu01"], "already_out": {}}


class Bounded(FakeKubernetes):
    """A Kubernetes backend whose requests end by a deadline: it records the ones it is given."""

    def __init__(self, nodes: list[str]) -> None:
        super().__init__(nodes)
        self.bounds: list[float] = []

    @contextmanager
    def deadline(self, until: float) -> Iterator[None]:
        self.bounds.append(until)
        yield


def test_the_kubernetes_count_ends_by_the_check_timeout_or_the_deadline() -> None:
    slurm, _ = systems()
    kubernetes = Bounded(["gpu05"])
    kubernetes.nodes["gpu05"] = replace(kubernetes.nodes["gpu05"], gpus_allocatable=8)
    guard = evaluator(slurm, kubernetes)
    began = time.monotonic()
    guard(check(pool_of="gpu05", pool="kubernetes"), 1e12)  # the check's 10 s timeout
    guard(check(pool_of="gpu05", pool="kubernetes"), began + 2)  # the run's deadline first
    assert began + 10 <= kubernetes.bounds[0] <= time.monotonic() + 10
    assert kubernetes.bounds[1] == began + 2


def test_a_node_with_no_other_names_is_counted_by_its_own() -> None:
    slurm, kubernetes = systems()
    inventory = Inventory(frozenset({"gpu05"}), frozenset(), frozenset({"gpu05", "gpu06"}))
    guard = CapacityEvaluator(inventory, slurm, kubernetes, None, pools=PoolsConfig())
    outcome = guard(check(pool_of="gpu05"), 1e12)
    assert outcome.extra["pools"]["Kubernetes"]["counted"] == ["gpu05"]
    assert outcome.value == 8

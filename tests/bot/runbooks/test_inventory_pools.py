"""Which pool a node serves (handoff-node): the Kubernetes pool label, the Slurm drain
reason; a node both systems know stays in the inventory and keeps its names whichever pool
it serves, and templates read the pool marks as ``pools``."""

from __future__ import annotations

from bot.config import InventoryConfig
from bot.config.remediation import PoolsConfig
from bot.runbooks import templating
from bot.runbooks.inventory import InventorySources, Seen, build, serves_kubernetes, serves_slurm


def config() -> InventoryConfig:
    return InventoryConfig.model_validate({"names": {"gpu04": {"kubernetes": "gpu04.k8s"}}})


def test_the_marks_decide_the_pool() -> None:
    pools = PoolsConfig()
    assert serves_kubernetes(None) and serves_kubernetes("kubernetes")
    assert not serves_kubernetes("slurm")
    assert serves_slurm(None, pools) and serves_slurm("XID 79", pools)
    assert not serves_slurm("pool: kubernetes (handoff-node)", pools)
    assert serves_slurm("pool: kubernetes", PoolsConfig(reason_prefix="serving pool"))


def test_a_node_serving_slurm_is_not_in_the_kubernetes_pool() -> None:
    sources = InventorySources(
        slurm=lambda: ["gpu01", Seen("gpu04")],
        kubernetes=lambda: [Seen("gpu04.k8s", pool_label="slurm"), Seen("gpu05"),
                            Seen("gpu06", pool_label="kubernetes")])
    inventory = build(config(), sources)
    assert inventory.slurm == {"gpu01", "gpu04"}
    assert inventory.kubernetes == {"gpu05", "gpu06"}  # no label: as before, Kubernetes
    assert inventory.nodes == {"gpu01", "gpu04", "gpu05", "gpu06"}
    assert inventory.in_kubernetes == {"gpu04", "gpu05", "gpu06"}
    assert inventory.pool_of("gpu04") == ["slurm"]
    facts = {**inventory.facts(), "node": "gpu04"}
    assert templating.render("{{ kubernetes_name[node] }}", facts) == "gpu04.k8s"
    assert not templating.condition("{{ node in kubernetes }}", facts)


def test_a_node_drained_with_the_pool_reason_serves_kubernetes() -> None:
    sources = InventorySources(
        slurm=lambda: [Seen("gpu03", drain_reason="XID 79"),
                       Seen("gpu04", drain_reason="pool: kubernetes (handoff-node)")],
        kubernetes=lambda: [Seen("gpu04.k8s", pool_label="kubernetes")])
    inventory = build(config(), sources)
    assert inventory.slurm == {"gpu03"}  # drained for a fault: still the Slurm pool's
    assert inventory.kubernetes == {"gpu04"} and inventory.in_slurm == {"gpu03", "gpu04"}
    assert inventory.pool_of("gpu04") == ["kubernetes"]
    assert templating.render("{{ slurm_name[node] }}", {**inventory.facts(),
                                                       "node": "gpu04"}) == "gpu04"


def test_templates_read_the_configured_marks() -> None:
    pools = PoolsConfig(label="example.com/pool", taint="example.com/pool-taint",
                        reason_prefix="serving", slurm_feature="train")
    facts = build(config(), InventorySources(), pools).facts()
    assert templating.render("{{ pools.label }} {{ pools.taint }} {{ pools.reason }} "
                             "{{ pools.feature }}", facts) == (
        "example.com/pool example.com/pool-taint serving train")
    assert templating.render("{{ {pools.label: 'slurm'} }}", facts) == {
        "example.com/pool": "slurm"}
    assert build(config(), InventorySources()).facts()["pools"]["feature"] == ""

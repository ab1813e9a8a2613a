"""The inventory: pools from Slurm and Kubernetes under the bot's names, name mappings for
templates, and a fallback to the configured list when a system cannot be asked."""

from __future__ import annotations

from bot.config import InventoryConfig
from bot.runbooks import templating
from bot.runbooks.inventory import InventorySources, build


def config(**extra: object) -> InventoryConfig:
    return InventoryConfig.model_validate({"nodes": ["gpu01", "gpu02"], **extra})


def test_static_nodes_are_the_slurm_pool_without_discovery() -> None:
    inventory = build(config(), InventorySources())
    assert inventory.nodes == {"gpu01", "gpu02"} == inventory.slurm
    assert inventory.kubernetes == frozenset()


def test_discovered_pools_with_a_node_in_both() -> None:
    sources = InventorySources(slurm=lambda: ["gpu01", "gpu02", "gpu04"],
                               kubernetes=lambda: ["gpu04.k8s", "gpu05"])
    inventory = build(config(names={"gpu04": {"kubernetes": "gpu04.k8s"}}), sources)
    assert inventory.slurm == {"gpu01", "gpu02", "gpu04"}
    assert inventory.kubernetes == {"gpu04", "gpu05"}
    assert inventory.nodes == {"gpu01", "gpu02", "gpu04", "gpu05"}
    facts = inventory.facts()
    assert templating.render("{{ kubernetes_name[node] }}", {**facts, "node": "gpu04"}) == (
        "gpu04.k8s")
    assert templating.render("{{ kubernetes_name[node] }}", {**facts, "node": "gpu05"}) == "gpu05"
    assert templating.condition("{{ node in kubernetes and node in slurm }}",
                                {**facts, "node": "gpu04"})


def test_unreachable_system_falls_back_with_a_warning() -> None:
    def broken() -> list[str]:
        raise RuntimeError("slurmctld is not answering")

    sources = InventorySources(slurm=broken)
    inventory = build(config(), sources)
    assert inventory.slurm == {"gpu01", "gpu02"}
    assert "could not list Slurm nodes (slurmctld is not answering)" in sources.problems[0]

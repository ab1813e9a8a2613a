"""A long-running bot lists the pools again (``inventory.refresh_seconds``): after a node is
handed to the other pool, the next plan takes its new pool's steps, not the ones of the pool
it served when the process started."""

from __future__ import annotations

from typing import Any

import pytest

from bot.config import InventoryConfig
from bot.config.remediation import PoolsConfig
from bot.runbooks.inventory import InventorySources, LiveInventory, Seen
from kit.errors import Refused
from tests.bot.execution.test_engine import record
from tests.conftest import BotFactory


class Pools:
    """What Kubernetes says gpu04 serves, changed by the test; how often it was asked."""

    def __init__(self) -> None:
        self.label = "slurm"
        self.asked = 0
        self.broken = False

    def kubernetes(self) -> list[Seen]:
        self.asked += 1
        if self.broken:
            raise ConnectionError("the API server does not answer")
        return [Seen("gpu04", pool_label=self.label), Seen("gpu05")]


def live(pools: Pools, clock: list[float], max_age: float = 5.0) -> LiveInventory:
    sources = InventorySources(slurm=lambda: ["gpu01", "gpu04"], kubernetes=pools.kubernetes)
    return LiveInventory(InventoryConfig(), sources, PoolsConfig(), {}, max_age,
                         clock=lambda: clock[0])


def test_the_pools_are_listed_again_once_older_than_refresh_seconds() -> None:
    pools, clock = Pools(), [100.0]
    inventory = live(pools, clock)
    assert "gpu04" not in inventory.current().kubernetes
    pools.label = "kubernetes"  # handoff-node moved it
    clock[0] += 4.9
    assert "gpu04" not in inventory.current().kubernetes and pools.asked == 1
    clock[0] += 0.1
    assert "gpu04" in inventory.current().kubernetes and pools.asked == 2


def test_zero_lists_them_for_every_plan_and_an_outage_falls_back_as_at_start() -> None:
    pools, clock = Pools(), [0.0]
    inventory = live(pools, clock, max_age=0)
    assert pools.asked == 0  # nothing listed until asked
    inventory.current()
    inventory.current()
    assert pools.asked == 2
    heard: list[list[str]] = []
    inventory.on_problems = heard.append
    pools.broken = True
    fallen = inventory.current()
    assert fallen.kubernetes == frozenset()  # not a stale pool: nothing from that system
    assert "gpu01" in fallen.slurm
    assert len(heard) == 1 and "could not list Kubernetes nodes" in heard[0][0]
    assert "the API server does not answer" in heard[0][0]
    pools.broken = False
    inventory.current()
    assert len(heard) == 1  # a listing without a problem says nothing


def test_a_bot_lists_the_pools_only_when_a_command_first_reads_them(
        make_bot: BotFactory) -> None:
    """status, approve, cancel... never wait on a Slurm or Kubernetes that does not answer."""
    from bot.service import NOT_LISTED_YET, Service

    bot = make_bot({})
    pools, clock = Pools(), [0.0]
    lazy = Service(config=bot.config, db=bot.db, catalogue=bot.catalogue, checks=bot.checks,
                   inventory=NOT_LISTED_YET, live_inventory=live(pools, clock))
    lazy.runbooks()
    with pytest.raises(Refused):
        lazy.get(999)  # what status, approve and cancel start with
    assert pools.asked == 0
    assert "gpu05" in lazy.inventory.kubernetes and pools.asked == 1
    assert "gpu05" in lazy.inventory.nodes and pools.asked == 1  # kept until refreshed
    lazy.inventory = lazy.inventory  # a test (or a window) may set it, as before
    assert pools.asked == 1
    with pytest.raises(ValueError, match="needs live_inventory"):
        Service(config=bot.config, db=bot.db, catalogue=bot.catalogue, checks=bot.checks,
                inventory=NOT_LISTED_YET)


def test_a_plan_takes_the_steps_of_the_pool_the_node_serves_now(make_bot: BotFactory) -> None:
    body: dict[str, Any] = {
        "name": "demo", "version": "1.0.0", "summary": "pool steps", "risk": "low",
        "params": {"node": {"type": "node", "required": True}},
        "steps": [record("k8s", "k", when="{{ node in kubernetes }}"),
                  record("slurm", "s", when="{{ node in slurm }}")]}
    bot = make_bot({"demo": body})
    pools, clock = Pools(), [0.0]
    bot.live_inventory = live(pools, clock)
    before = bot.plan("demo", {"node": "gpu04"})
    assert [s.id for s in before.steps if not s.skipped] == ["slurm"]
    pools.label = "kubernetes"
    clock[0] += 10
    after = bot.plan("demo", {"node": "gpu04"})
    assert [s.id for s in after.steps if not s.skipped] == ["k8s", "slurm"]
    assert after.hash != before.hash  # approved before the move: asked again

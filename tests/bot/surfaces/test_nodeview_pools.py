"""The node view of a hand-off node: the pool it serves now (from what Slurm and Kubernetes
say, by the inventory's rule), its MIG layout (Kubernetes' mig.config label and state,
Slurm's Gres), both systems shown whichever pool it serves, and the history of its moves
with their ``to=`` (``runbook node``, chat and the console)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from adapters.kubernetes.fake import FakeKubernetes
from adapters.slurm.fake import FakeSlurm
from bot.config import InventoryConfig
from bot.config.remediation import PoolsConfig
from bot.execution.engine import Engine
from bot.runbooks.inventory import InventorySources, PoolInventory, Seen, build
from bot.service import Service
from bot.surfaces import nodeview
from tests.bot import fakes
from tests.bot.execution.test_engine import record, runbook
from tests.bot.surfaces.console.pagehelp import as_user, client, overrides, parse
from tests.conftest import NODES, BotFactory

POOL = PoolsConfig().label


@pytest.fixture
def bot(make_bot: BotFactory) -> Service:
    fakes.reset()
    handoff = runbook([record("a", "{{ node }}")], risk="low")
    handoff["name"] = "handoff-node"
    handoff["params"]["to"] = {"type": "enum", "choices": ["kubernetes", "slurm"],
                               "required": True}
    bot = make_bot({"handoff-node": handoff}, **overrides())
    slurm = FakeSlurm(NODES)
    slurm.state["gpu04"] = replace(slurm.state["gpu04"], gres="gpu:3g.40gb:16")
    kubernetes = FakeKubernetes(["gpu04", "gpu05"])
    kubernetes.nodes["gpu04"] = replace(kubernetes.nodes["gpu04"], labels={
        POOL: "slurm", "nvidia.com/mig.config": "all-3g.40gb",
        "nvidia.com/mig.config.state": "success"})
    bot.backends = {"slurm": slurm, "kubernetes": kubernetes}
    bot.inventory = inventory(slurm, kubernetes)
    return bot


def inventory(slurm: FakeSlurm, kubernetes: FakeKubernetes) -> PoolInventory:
    sources = InventorySources(
        slurm=lambda: [Seen(n.name, drain_reason=n.reason if "DRAIN" in n.flags else None)
                       for n in slurm.nodes(None, with_jobs=False)],
        kubernetes=lambda: [Seen(n.name, pool_label=n.labels.get(POOL))
                            for n in kubernetes.list_nodes()])
    return build(InventoryConfig.model_validate({"nodes": NODES}), sources)


def test_a_node_serving_slurm_shows_both_systems_its_pool_and_mig(bot: Service) -> None:
    (view,) = nodeview.build(bot, ["gpu04"])
    assert view.pools == ["slurm"]
    assert view.kubernetes is not None and view.kubernetes["pool_label"] == "slurm"
    assert view.mig == {"config": "all-3g.40gb", "state": "success",
                        "slurm_gres": "gpu:3g.40gb:16"}
    shown = nodeview.text(view)
    assert shown.splitlines()[:2] == [
        "node gpu04: serves slurm",
        "  MIG: layout all-3g.40gb (success), Slurm gres gpu:3g.40gb:16"]
    assert "Kubernetes: schedulable" in shown


def test_the_pool_follows_the_systems_not_a_stale_inventory(bot: Service) -> None:
    slurm, kubernetes = bot.backends["slurm"], bot.backends["kubernetes"]
    slurm.update_nodes(["gpu04"], "DRAIN", "pool: kubernetes (handoff-node)")
    kubernetes.patch_node("gpu04", {"metadata": {"labels": {POOL: "kubernetes"}}})
    (view,) = nodeview.build(bot, ["gpu04"])  # the inventory was built before the move
    assert view.pools == ["kubernetes"]
    assert nodeview.text(view).startswith("node gpu04: serves kubernetes")
    assert view.slurm is not None and view.slurm["reason"].startswith("pool: kubernetes")
    bot.inventory = inventory(slurm, kubernetes)
    assert "gpu04" in bot.inventory.kubernetes and "gpu04" not in bot.inventory.slurm


def test_history_shows_each_move_with_its_to(bot: Service) -> None:
    engine = Engine(bot, sleep=lambda s: None)
    for to in ("kubernetes", "slurm"):
        engine.drive(bot.request("handoff-node", {"node": "gpu04", "to": to}, "alice"))
    engine.close()
    (view,) = nodeview.build(bot, ["gpu04"])
    assert [(ex["runbook"], ex["to"]) for ex in view.executions] == [
        ("handoff-node", "slurm"), ("handoff-node", "kubernetes")]
    shown = nodeview.text(view)
    assert "execution 2: handoff-node to=slurm succeeded" in shown
    assert "execution 1: handoff-node to=kubernetes succeeded" in shown
    answer = client(bot).get("/ui/nodes/gpu04", headers=as_user("alice"))
    assert answer.status_code == 200, answer.text[:2000]
    doc = parse(answer.text)
    text = doc.text()
    assert "Serves" in text and "slurm" in text
    assert "all-3g.40gb (success)" in text and "gpu:3g.40gb:16" in text
    rows = doc.all("table")[-1].rows()
    assert [row[1] for row in rows] == ["handoff-node 1.0.0 to=slurm",
                                        "handoff-node 1.0.0 to=kubernetes"]


def test_a_node_without_mig_shows_its_gres_and_no_mig_line(bot: Service) -> None:
    slurm = bot.backends["slurm"]
    slurm.state["gpu01"] = replace(slurm.state["gpu01"], gres="gpu:h100:8")
    (view,) = nodeview.build(bot, ["gpu01"])
    assert view.mig == {} and view.pools == ["slurm"]
    shown = nodeview.text(view)
    assert "MIG" not in shown and "jobs -, gres gpu:h100:8" in shown

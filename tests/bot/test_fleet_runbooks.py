"""The shipped drain-nodes and resume-nodes runbooks over the in-memory Slurm and Kubernetes
fakes: a plan of 1,024 nodes in well under a second (batches, not a step per node), the
capacity guard over the whole set (both pools, just under and at the floor, the site floor
that break-glass never lowers), and runs through the engine: the node states in the root
chat message and ``runbook status``, and a failure whose undo touches only this run's nodes."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from adapters.slurm.config import SlurmConfig
from adapters.slurm.fleet import DrainBatchesAction, ResumeBatchesAction
from bot.config import GuardsConfig, PoolFloors
from bot.execution.checks.capacity import CapacityEvaluator
from bot.execution.checks.core import Checks
from bot.execution.checks.slurm import SlurmEvaluator
from bot.execution.engine import Engine
from bot.runbooks.catalogue import KNOWN, Catalogue
from bot.runbooks.params import Inventory
from bot.service import Service
from bot.surfaces.rendering import plan_text, status_text
from bot.surfaces.slack.blocks import progress_message
from kit import hostlist
from kit.errors import Refused
from tests.adapters.test_gpu_gate_fleet import Fleet
from tests.bot.schedule.windowfakes import Systems
from tests.conftest import BotFactory

RUNBOOKS = Path(__file__).resolve().parents[2] / "runbooks"
NAMES = ("drain-nodes", "resume-nodes")


def fleet_bot(make_bot: BotFactory, slurm: list[str], k8s: list[str],
              site: PoolFloors | None = None) -> tuple[Service, Systems]:
    """The shipped fleet runbooks over fakes: ``slurm`` and ``k8s`` nodes, 8 GPUs each."""
    nodes = sorted(set(slurm) | set(k8s))
    bot = make_bot({name: (RUNBOOKS / f"{name}.yaml").read_text() for name in NAMES},
                   inventory={"nodes": nodes},
                   guards=GuardsConfig(min_free_gpus=site or PoolFloors()))
    systems = Systems(slurm, k8s)
    for name, node in list(systems.kubernetes.nodes.items()):
        systems.kubernetes.nodes[name] = replace(node, gpus_allocatable=8)
    inventory = Inventory(nodes=frozenset(nodes), slurm=frozenset(slurm),
                          kubernetes=frozenset(k8s))
    bot.inventory = inventory
    bot.catalogue = Catalogue([*bot.catalogue._actions.values(), *systems.actions(),
                               DrainBatchesAction(systems.slurm, SlurmConfig(), lambda s: None),
                               # the GPU gate over a DCGM where every node reports 8 GPUs
                               ResumeBatchesAction(systems.slurm, SlurmConfig(), lambda s: None,
                                                   prometheus=Fleet(nodes), gpu_settle=0.01)],
                              KNOWN)
    bot.checks = Checks({"capacity": CapacityEvaluator(
        inventory, systems.slurm, systems.kubernetes, site_floors=site),
        "slurm": SlurmEvaluator(systems.slurm)}, sleep=lambda s: None)
    return bot, systems


def names(expression: str) -> list[str]:
    return hostlist.expand(expression)


def test_a_plan_over_1024_nodes_takes_well_under_a_second(make_bot: BotFactory) -> None:
    bot, _ = fleet_bot(make_bot, names("gpu[0001-1536]"), names("gpu[1025-2048]"))
    params = {"nodes": "gpu[0769-1792]", "reason": "row 4 power work"}
    took = []
    for _ in range(3):
        started = time.perf_counter()
        plan = bot.plan("drain-nodes", params)
        text = plan_text(plan)
        took.append(time.perf_counter() - started)
    assert min(took) <= 1.0, f"planning 1,024 nodes took {min(took):.2f}s"
    assert [s.id for s in plan.steps] == ["slurm-drain", "k8s-drain", "wait-idle"]
    batches = [op for op in plan.steps[0].operations if op.startswith("scontrol update")]
    assert len(batches) == 768 // 16 and "NodeName=gpu[0769-0784] State=DRAIN" in batches[0]
    assert "kubectl drain gpu[1025-1792]" in plan.steps[1].operations[0]
    assert len(plan.locks) == 1024 and "locks: node:gpu[0769-1792]" in text


def test_the_capacity_guard_counts_the_whole_set_in_each_pool(make_bot: BotFactory) -> None:
    # Slurm gpu[01-06] (48 free), Kubernetes gpu[05-10] (48 free); gpu05-06 in both
    bot, _ = fleet_bot(make_bot, names("gpu[01-06]"), names("gpu[05-10]"))
    at_floor = {"nodes": "gpu[03-08]", "reason": "r", "min_free_gpus": "16"}
    assert bot.plan("drain-nodes", at_floor)  # 16 left in each pool: exactly the floor
    under = {**at_floor, "nodes": "gpu[03-09]"}  # Kubernetes would keep 8
    with pytest.raises(Refused) as caught:
        bot.plan("drain-nodes", under)
    message = str(caught.value)
    assert ("Kubernetes pool: 48 free GPUs now, 8 after taking gpu[05-09] (5 nodes) out "
            "(floor 16)") in message
    assert "Slurm pool: 48 free GPUs now, 16 after taking gpu[03-06] (4 nodes) out" in message
    assert bot.plan("drain-nodes", under, break_glass=True).approval.required == 2


def test_the_site_floor_holds_for_a_set_even_with_break_glass(make_bot: BotFactory) -> None:
    bot, _ = fleet_bot(make_bot, names("gpu[01-06]"), [], site=PoolFloors(slurm=24))
    fine = {"nodes": "gpu[01-03]", "reason": "r", "min_free_gpus": "0"}
    assert bot.plan("drain-nodes", fine, break_glass=True)  # 24 left: at the site floor
    with pytest.raises(Refused, match=r"site floor.*16 after taking gpu\[01-04\]"):
        bot.plan("drain-nodes", {**fine, "nodes": "gpu[01-04]"}, break_glass=True)


def test_max_parallel_above_its_default_is_break_glass(make_bot: BotFactory) -> None:
    bot, _ = fleet_bot(make_bot, names("gpu[01-06]"), [])
    params = {"nodes": "gpu[01-02]", "reason": "r"}
    assert bot.plan("drain-nodes", {**params, "max_parallel": "8"})  # lower: no guard weakened
    with pytest.raises(Refused, match="max_parallel"):
        bot.plan("drain-nodes", {**params, "max_parallel": "32"})
    with pytest.raises(Refused, match="above the maximum 64"):
        bot.plan("drain-nodes", {**params, "max_parallel": "65"}, break_glass=True)
    with pytest.raises(Refused, match="reason: control characters are not allowed"):
        bot.plan("drain-nodes", {**params, "reason": "two\nlines"})


def run(bot: Service, name: str, params: dict[str, str]) -> Any:
    execution_id = bot.request(name, params, "alice")
    if bot.get(execution_id).state == "awaiting_approval":
        bot.approve(execution_id, "carol")
    return Engine(bot, sleep=lambda s: None).drive(execution_id)


def test_each_batch_asks_the_capacity_guard_again(make_bot: BotFactory) -> None:
    """Others drain half the pool while the first batch drains: the second is refused with
    the numbers of that moment, before it is touched, and the undo gives back this run's."""
    bot, systems = fleet_bot(make_bot, names("gpu[01-08]"), [])
    real = systems.slurm.update_nodes

    def others_drain_meanwhile(nodes: list[str], state: str, reason: str | None = None) -> None:
        real(nodes, state, reason)
        if nodes == ["gpu01", "gpu02"] and state == "DRAIN":
            real(names("gpu[05-08]"), "DRAIN", "bob: rack 2 power")

    systems.slurm.update_nodes = others_drain_meanwhile  # type: ignore[assignment,method-assign]
    ex = run(bot, "drain-nodes", {"nodes": "gpu[01-04]", "reason": "rack 1",
                                  "max_parallel": "2"})
    assert ex.state == "failed"
    assert ("capacity guard before taking gpu[03-04] out: capacity stays above the floor with "
            "the whole set out: Slurm pool: 16 free GPUs now, 0 after taking gpu[03-04] "
            "(2 nodes) out") in (ex.error or "")
    assert [n for n in names("gpu[01-04]") if "DRAIN" in systems.slurm.state[n].flags] == []
    assert all("DRAIN" in systems.slurm.state[n].flags for n in names("gpu[05-08]"))


def test_drain_then_resume_a_set_shows_node_states_in_one_message(
        make_bot: BotFactory) -> None:
    bot, systems = fleet_bot(make_bot, names("gpu[01-06]"), names("gpu[05-08]"))
    for node in ("gpu05", "gpu07"):
        systems.kubernetes.pods.append(_pod(node))
    ex = run(bot, "drain-nodes", {"nodes": "gpu[02-07]", "reason": "rack"})
    assert ex.state == "succeeded", ex.error
    drained = sorted(n for n, i in systems.slurm.state.items() if "DRAIN" in i.flags)
    assert drained == names("gpu[02-06]")
    assert set(systems.cordoned()) == set(names("gpu[05-07]"))
    states = bot.step_states(ex.id)
    text = str(progress_message(ex, ["carol"], states).blocks)
    assert "drained 5/5 gpu[02-06]" in text and "drained 3/3 gpu[05-07]" in text
    assert "k8s-drain: drained 3/3 gpu[05-07]" in status_text(ex, ["carol"], states)
    back = run(bot, "resume-nodes", {"nodes": "gpu[02-07]"})
    assert back.state == "succeeded", back.error
    assert not any("DRAIN" in i.flags for i in systems.slurm.state.values())
    assert systems.cordoned() == {}


def test_a_failed_kubernetes_node_undoes_only_this_runs_drains(make_bot: BotFactory) -> None:
    bot, systems = fleet_bot(make_bot, names("gpu[01-06]"), names("gpu[05-08]"))
    systems.slurm.update_nodes(["gpu03"], "DRAIN", "someone else's")
    systems.kubernetes.patch_node("gpu06", {"spec": {"unschedulable": True}})
    systems.kubernetes.pods.append(replace(_pod("gpu07"), owner_kind=None))  # refused
    ex = run(bot, "drain-nodes", {"nodes": "gpu[02-07]", "reason": "rack",
                                  "max_parallel": "1"})
    assert ex.state == "failed"
    assert "drain of gpu07 failed" in (ex.error or "") and "drained: gpu[05-06]" in (ex.error
                                                                                     or "")
    shown = status_text(ex, ["carol"], bot.step_states(ex.id))  # where it stopped
    assert ("k8s-drain: drained 2/3 gpu[05-06] · draining — · blocked by PDB — · failed 1 "
            "gpu07") in shown
    drained = {n: i.reason for n, i in systems.slurm.state.items() if "DRAIN" in i.flags}
    assert drained == {"gpu03": "someone else's"}
    assert systems.cordoned() == {"gpu06": None}


def _pod(node: str) -> Any:
    from adapters.kubernetes.backend import Pod

    return Pod("serving", f"{node}-web", f"uid-{node}", node=node, phase="Running",
               ready=True, owner_kind="ReplicaSet")


def test_a_backend_that_cannot_drain_refuses_the_plan_before_approval(
        make_bot: BotFactory) -> None:
    """slurmrestd 22.05 (``slurm.backend: rest``) has no node update: the request is refused
    when it is planned, with the backend's reason, and nothing is recorded; a set wholly in
    the Kubernetes pool, whose Slurm steps do not run, is still planned."""
    bot, systems = fleet_bot(make_bot, names("gpu[01-04]"), names("gpu[05-08]"))
    reason = ("slurmrestd v0.0.38 (Slurm 22.05) has no node update (drain/resume); it needs "
              "v0.0.39 (Slurm 23.02) or later, or slurm.backend: cli")
    refuse = {"update_nodes": reason}
    systems.slurm.unsupported = refuse.get  # type: ignore[attr-defined]
    params = {"nodes": "gpu[01-02]", "reason": "r"}
    with pytest.raises(Exception, match=r"step slurm-drain \(slurm.drain_batches\): slurmrestd "
                                        r"v0\.0\.38 \(Slurm 22\.05\) has no node update"):
        bot.plan("drain-nodes", params)
    with pytest.raises(Exception, match="has no node update"):
        bot.request("drain-nodes", params, "alice")
    assert all(not n.flags for n in systems.slurm.nodes(names("gpu[01-02]")))
    assert bot.plan("drain-nodes", {**params, "nodes": "gpu[06-07]"})
    assert bot.request("drain-nodes", {**params, "nodes": "gpu[06-07]"}, "alice") == 1  # the
    # first execution recorded: the refused request left none

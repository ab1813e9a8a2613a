"""The shipped upgrade-driver runbook through the bot, over the in-memory fakes: a driver
below the pool's CUDA floor is refused before any plan (nothing changed), canaries that
are also in nodes= are refused, a higher max_parallel or a shorter soak need break-glass,
the same lock as rollback-driver, the Kubernetes plan's steps (skip labels on all but the
canaries, released after the soak), and Slurm runs end to end through the engine
(success; a failure in the rest with the nodes done and the rollback)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from adapters.actions import Action
from adapters.kubernetes.actions import KubernetesActions
from adapters.kubernetes.config import KubernetesConfig
from adapters.kubernetes.fake import FakeKubernetes
from adapters.kubernetes.gpu_gate import GpuGateNodesAction
from adapters.prometheus.config import PrometheusConfig
from adapters.prometheus.fake import FakePrometheus
from adapters.prometheus.soak import ErrorsHoldAction
from adapters.slurm.config import SlurmConfig
from adapters.slurm.driver_upgrade import DriverUpgradeAction
from adapters.slurm.rolling import DriverRolloutAction
from bot.execution.checks.capacity import CapacityEvaluator
from bot.execution.checks.core import Checks
from bot.execution.checks.slurm import SlurmEvaluator
from bot.execution.engine import Engine
from bot.runbooks.catalogue import KNOWN, Catalogue
from bot.runbooks.params import Inventory
from bot.service import Service
from kit.errors import Refused
from tests.adapters.test_driver_upgrade import COMMANDS, NEW, OLD, DriverSlurm, errors
from tests.conftest import LAB_USERS, BotFactory

RUNBOOKS = Path(__file__).resolve().parents[2] / "runbooks"
SLURM = ["gpu01", "gpu02", "gpu03", "gpu04"]
KUBE = ["gpu05", "gpu06"]


def upgrade_bot(make_bot: BotFactory) -> tuple[Service, DriverSlurm]:
    """The shipped runbooks, the pools' CUDA 12.4 (floor 550.54.14), fakes behind them."""
    bot = make_bot({name: (RUNBOOKS / f"{name}.yaml").read_text()
                    for name in ("upgrade-driver", "rollback-driver")},
                   drivers={"pools": {"slurm": {"cuda": ["12.4"]},
                                      "kubernetes": {"cuda": ["12.4"]}}},
                   users={**LAB_USERS, "erin": {"groups": ["gpu-leads"]}})
    slurm = DriverSlurm(SLURM)
    prom = FakePrometheus(errors(SLURM + KUBE), gpus=8)
    config = SlurmConfig.model_validate({"commands": COMMANDS})

    def sleep(seconds: float) -> None:
        time.sleep(min(seconds, 0.01))

    kubernetes = FakeKubernetes(KUBE)
    for name, node in list(kubernetes.nodes.items()):
        kubernetes.nodes[name] = replace(node, gpus_allocatable=8)
    actions: list[Action] = [
               DriverUpgradeAction(slurm, config, sleep, prometheus=prom, gpu_settle=0.05),
               DriverRolloutAction(slurm, config, sleep, prometheus=prom, gpu_settle=0.05),
               ErrorsHoldAction(prom, PrometheusConfig(url="http://prometheus.invalid:9090")),
               *KubernetesActions(kubernetes, sleep=lambda s: None).all(),
               GpuGateNodesAction(kubernetes, KubernetesConfig(), sleep, prometheus=prom,
                                  gpu_settle=0.05)]
    bot.catalogue = Catalogue([*bot.catalogue._actions.values(), *actions], KNOWN)
    nodes = frozenset(SLURM + KUBE)
    bot.inventory = Inventory(nodes=nodes, slurm=frozenset(SLURM), kubernetes=frozenset(KUBE),
                              driver_floors=bot.config.drivers.floors())
    bot.checks = Checks({"slurm": SlurmEvaluator(slurm), "capacity": CapacityEvaluator(
        bot.inventory, slurm, kubernetes)}, sleep=lambda s: None)
    return bot, slurm


def asked(**over: str) -> dict[str, str]:
    return {"pool": "slurm", "version": NEW, "canary": "gpu01", "nodes": "gpu[02-03]",
            "soak": "30m", **over}


def test_a_driver_below_the_cuda_floor_is_refused_before_any_plan(
        make_bot: BotFactory) -> None:
    bot, slurm = upgrade_bot(make_bot)
    for pool in ("slurm", "kubernetes"):
        with pytest.raises(Refused, match=r"version: driver 535\.161\.08 is below 550\.54\.14, "
                                          r".*drivers\.pools\." + pool + r"\.cuda"):
            bot.plan("upgrade-driver", asked(pool=pool, version=OLD))
    with pytest.raises(Refused, match=r"below 550\.54\.14"):
        bot.request("upgrade-driver", asked(version=OLD), "alice")
    assert bot.plan("upgrade-driver", asked()).params["version"] == NEW
    assert slurm.calls == []  # nothing was changed, nothing was even run


def test_canaries_repeated_in_nodes_are_refused(make_bot: BotFactory) -> None:
    bot, _ = upgrade_bot(make_bot)
    with pytest.raises(Refused, match=r"gpu02 named both in canary= and in nodes="):
        bot.plan("upgrade-driver", asked(canary="gpu[01-02]"))
    with pytest.raises(Refused, match=r"nodes= is required for the Slurm pool"):
        bot.plan("upgrade-driver", {k: v for k, v in asked().items() if k != "nodes"})
    with pytest.raises(Refused, match=r"nodes=gpu06 does not apply to the Kubernetes pool"):
        bot.plan("upgrade-driver", asked(pool="kubernetes", canary="gpu05", nodes="gpu06"))


def test_guards_approvals_and_the_lock_of_rollback_driver(make_bot: BotFactory) -> None:
    bot, _ = upgrade_bot(make_bot)
    plan = bot.plan("upgrade-driver", asked())
    assert plan.approval.required == 2
    assert plan.locks == ["driver:slurm-pool", "node:gpu01", "node:gpu02", "node:gpu03"]
    for weaker, why in (({"max_parallel": "2"}, "higher"), ({"soak": "5m"}, "lower")):
        with pytest.raises(Refused, match=rf"weakens a guard .*{why} than its default"):
            bot.request("upgrade-driver", asked(**weaker), "alice")
    first = bot.request("upgrade-driver", asked(), "alice")
    with pytest.raises(Refused, match=rf"driver:slurm-pool is held by execution {first}"):
        bot.request("rollback-driver", {"nodes": "gpu04", "version": OLD}, "bob")


def test_the_kubernetes_plan(make_bot: BotFactory) -> None:
    bot, _ = upgrade_bot(make_bot)
    params = {**{k: v for k, v in asked().items() if k != "nodes"}, "pool": "kubernetes",
              "canary": "gpu05"}
    plan = bot.plan("upgrade-driver", params)
    ran = [s.id for s in plan.steps if not s.skipped]
    assert ran == ["announce", "k8s-hold", "k8s-policy", "k8s-set-version", "k8s-canary-wait",
                   "k8s-soak", "k8s-release", "k8s-wait", "k8s-verify", "k8s-gpus"]
    steps = {s.id: s for s in plan.steps}
    assert steps["k8s-hold"].args["canary"] == "gpu05"
    assert steps["k8s-hold"].undo is None  # a failure or cancel leaves the rest held back
    assert "nvidia.com/gpu-driver-upgrade.skip=true gpu-runbook-bot/upgrade-skip-set=true " \
        "for every node matching nvidia.com/gpu.present=true but gpu05" in \
        steps["k8s-hold"].operations[0]
    assert steps["k8s-release"].args["remove"] is True
    unskipped = "nvidia.com/gpu.present=true,nvidia.com/gpu-driver-upgrade.skip!=true"
    for wait in ("k8s-canary-wait", "k8s-wait"):
        assert steps[wait].args["label_selector"] == unskipped
        assert steps[wait].args["version"] == NEW
    assert steps["k8s-policy"].args["max_parallel"] == 1
    assert "maxParallelUpgrades\":1" in steps["k8s-policy"].operations[0]
    assert steps["k8s-soak"].args["duration"] == 1800
    for held in ("k8s-canary-wait", "k8s-soak"):
        hint = steps[held].args["hint"]
        assert ("The rest was not started: the nodes this run held back keep their driver "
                "with nvidia.com/gpu-driver-upgrade.skip=true (kubectl get nodes -l "
                "gpu-runbook-bot/upgrade-skip-set=true lists them)") in hint
        assert ("runbook run rollback-driver pool=kubernetes, then kubectl label nodes -l "
                "gpu-runbook-bot/upgrade-skip-set=true nvidia.com/gpu-driver-upgrade.skip- "
                f"gpu-runbook-bot/upgrade-skip-set-; to go on to {NEW}") in hint
    assert "rollback-driver pool=kubernetes" in steps["k8s-wait"].args["hint"]
    assert steps["k8s-gpus"].args["nodes"] == dict.fromkeys(sorted(KUBE), "")
    assert steps["k8s-gpus"].args["cordon"] is True and steps["k8s-gpus"].args["fail_on_kept"]
    assert steps["k8s-verify"].args["label_selector"] == unskipped


def drive(bot: Service, params: dict[str, str]) -> Any:
    execution_id = bot.request("upgrade-driver", params, "alice", break_glass=True)
    for approver in ("carol", "dave", "erin"):
        if bot.get(execution_id).state == "awaiting_approval":
            bot.approve(execution_id, approver)
    engine = Engine(bot)
    try:
        return engine.drive(execution_id)
    finally:
        engine.close()


def test_a_slurm_upgrade_end_to_end(make_bot: BotFactory) -> None:
    bot, slurm = upgrade_bot(make_bot)
    ex = drive(bot, asked(soak="1s"))
    assert ex.state == "succeeded", ex.error
    assert slurm.driver == {"gpu01": NEW, "gpu02": NEW, "gpu03": NEW, "gpu04": OLD}
    installs = [c[1] for c in slurm.calls if c[0] == "srun" and c[3][0] == "install"]
    assert installs == ["gpu01", "gpu02", "gpu03"]


def test_a_slurm_failure_in_the_rest_stops_with_the_rollback(make_bot: BotFactory) -> None:
    bot, slurm = upgrade_bot(make_bot)
    slurm.fail["gpu02"] = "install"
    ex = drive(bot, asked(soak="1s"))
    assert ex.state == "failed"
    assert "gpu02: FAILED: driver-install failed" in (ex.error or "")
    assert "Done (on driver 550.54.15): gpu01; not started: gpu03" in (ex.error or "")
    assert (f"`runbook run rollback-driver pool=slurm nodes=gpu01 version={OLD}`"
            in (ex.error or ""))
    assert "left as they are" in (ex.error or "")
    assert slurm.driver["gpu03"] == OLD and "DRAIN" in slurm.state["gpu02"].flags


# --- the capacity guard: when the plan is made, and again before each node -------------


def test_the_plan_counts_a_batch_of_max_parallel_nodes_at_its_worst(
        make_bot: BotFactory) -> None:
    bot, slurm = upgrade_bot(make_bot)
    slurm.update_nodes(["gpu04"], "DRAIN", "bob: PSU fan")  # already out: costs nothing
    plan = bot.plan("upgrade-driver", asked())
    assert plan.capacity == [
        "capacity stays above the floor with a batch of nodes out: Slurm pool: 24 free GPUs "
        "now, 16 after taking 1 of gpu[01-03] (3 nodes) at once (the worst case: gpu01) out "
        "(floor 8)"]
    with pytest.raises(Refused, match=r"capacity guard: .* 24 free GPUs now, 8 after taking 2 "
                                      r"of gpu\[01-03\] .*\(floor 9\)"):
        bot.plan("upgrade-driver", asked(max_parallel="2", min_free_gpus="9"),
                 break_glass=False)
    plan = bot.plan("rollback-driver", {"nodes": "gpu[01-04]", "version": OLD})
    assert "gpu04 (drained)" in plan.capacity[0]


class DrainedMeanwhile(DriverSlurm):
    """Somebody drains gpu03 and gpu04 while gpu01's driver installs."""

    def run_on_node(self, node: str, reservation: str | None, argv: list[str],
                    timeout: float, env: Any = None) -> tuple[int, str, str]:
        if node == "gpu01" and argv[0] == "install":
            self.update_nodes(["gpu03", "gpu04"], "DRAIN", "bob: rack 4 power")
        return super().run_on_node(node, reservation, argv, timeout, env)


def test_the_guard_is_asked_again_before_each_node_and_stops_with_the_node_untouched(
        make_bot: BotFactory) -> None:
    bot, _ = upgrade_bot(make_bot)
    slurm = DrainedMeanwhile(SLURM)
    bot.catalogue = Catalogue([*bot.catalogue._actions.values(), DriverRolloutAction(
        slurm, SlurmConfig.model_validate({"commands": COMMANDS}), lambda s: None,
        prometheus=FakePrometheus(errors(SLURM), gpus=8), gpu_settle=0.05)], KNOWN)
    bot.checks = Checks({"slurm": SlurmEvaluator(slurm), "capacity": CapacityEvaluator(
        bot.inventory, slurm, None)}, sleep=lambda s: None)
    # planned: 32 free, 24 with one node out, floor 9; before gpu02: 16 free, 8 after
    execution_id = bot.request("rollback-driver", {"nodes": "gpu[01-02]", "version": NEW,
                                                   "min_free_gpus": "9"}, "alice")
    for approver in ("carol", "dave"):
        bot.approve(execution_id, approver)
    engine = Engine(bot)
    try:
        ex = engine.drive(execution_id)
    finally:
        engine.close()
    assert ex.state == "failed"
    assert ("capacity guard before taking gpu02 out: capacity stays above the floor with a "
            "batch of nodes out: Slurm pool: 16 free GPUs now, 8 after taking gpu02 out "
            "(floor 9)") in (ex.error or "")
    assert "gpu02 was not touched" in (ex.error or "")
    assert slurm.driver == {"gpu01": NEW, "gpu02": OLD, "gpu03": OLD, "gpu04": OLD}
    assert "DRAIN" not in slurm.state["gpu02"].flags
    assert not [c for c in slurm.calls if "gpu02" in str(c)]  # never touched

"""Guards a request may not weaken (invariant 6), over the shipped drain-node and an
in-memory Slurm: a parameter the runbook marks ``weakens_guard`` given a weaker value is
refused unless the requester asks for break-glass, which costs one more approval and is named
in the plan; the site floor (``guards.min_free_gpus``) is never lowered, by a parameter or by
break-glass, neither when the request is planned nor at its pre-check."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import pytest

from bot.execution.checks.capacity import CapacityEvaluator
from bot.execution.checks.core import Checks
from bot.execution.checks.slurm import SlurmEvaluator
from bot.execution.engine import Engine
from bot.runbooks.catalogue import Catalogue
from bot.service import Service
from bot.surfaces.rendering import plan_text
from bot.surfaces.slack.blocks import capacity_lines
from kit.canonical import canonical
from kit.errors import Refused
from tests.bot import fakes
from tests.bot.schedule.windowfakes import Systems
from tests.bot.test_service import kinds
from tests.conftest import BotFactory


@pytest.fixture(autouse=True)
def _clean() -> None:
    fakes.reset()


RUNBOOKS = Path(__file__).resolve().parents[3] / "runbooks"
DRAIN = {"node": "gpu01", "reason": "XID 79"}
WEAKENED = ("min_free_gpus=0 weakens a guard (free GPUs the pool must keep): it is lower than "
            "its default 8")


def drain_bot(make_bot: BotFactory, **config: Any) -> tuple[Any, Systems]:
    """The shipped drain-node over an in-memory Slurm of 4 idle nodes with 8 GPUs each (32
    free; 24 once gpu01 is out), with the real capacity and slurm checks."""
    systems = Systems(["gpu01", "gpu02", "gpu03", "gpu04"], ["gpu04"])
    bot = make_bot({"drain-node": (RUNBOOKS / "drain-node.yaml").read_text()}, **config)
    bot.catalogue = Catalogue([*bot.catalogue._actions.values(), *systems.actions()])
    bot.checks = Checks({
        "capacity": CapacityEvaluator(bot.inventory, systems.slurm,
                                      site_floors=bot.config.guards.min_free_gpus),
        "slurm": SlurmEvaluator(systems.slurm),
    }, sleep=lambda s: None)
    return bot, systems


def drive(bot: Service, execution_id: int) -> Any:
    engine = Engine(bot, sleep=lambda s: None)
    try:
        return engine.drive(execution_id)
    finally:
        engine.close()


@pytest.mark.parametrize("raw, message", [
    ({"min_free_gpus": "0"}, re.escape(WEAKENED)),
    ({"min_free_gpus": "7"}, r"min_free_gpus=7 weakens a guard .* lower than its default 8"),
    ({"requeue": "true"}, r"requeue=true weakens a guard .* not its default false"),
])
def test_a_parameter_that_weakens_a_guard_is_refused_without_break_glass(
        make_bot: BotFactory, raw: dict[str, str], message: str) -> None:
    bot, systems = drain_bot(make_bot)
    bot.runbooks()
    before = kinds(bot)
    with pytest.raises(Refused, match=message + r".*ask for break-glass \(--break-glass\): it "
                                                r"needs one more approval"):
        bot.request("drain-node", {**DRAIN, **raw}, "alice")
    assert kinds(bot) == [*before, "refused"]
    with pytest.raises(Refused, match="--break-glass"):
        bot.plan("drain-node", {**DRAIN, **raw})
    assert systems.slurm.calls == []


def test_break_glass_for_a_weakened_guard_needs_one_more_approval(make_bot: BotFactory) -> None:
    bot, systems = drain_bot(make_bot)
    execution_id = bot.request("drain-node", {**DRAIN, "min_free_gpus": "0"}, "alice",
                               break_glass=True)
    ex = bot.get(execution_id)
    assert ex.plan.break_glass and ex.approvals_required == 2  # medium risk: 1, +1
    assert [(g.param, g.weakens, g.default, g.value) for g in ex.plan.weakened_guards] == [
        ("min_free_gpus", "lower", 8, 0)]
    # the stored plan is the plan approved: its hash is the hash of what is shown
    assert hashlib.sha256(canonical(ex.plan.body()).encode()).hexdigest() == ex.plan_hash
    assert bot.approve(execution_id, "carol").state == "awaiting_approval"
    assert bot.approve(execution_id, "dave").state == "approved"
    ex = drive(bot, execution_id)
    assert ex.state == "succeeded", ex.error  # planned again at start: the same plan
    assert "approval_voided" not in kinds(bot, execution_id)
    assert "DRAIN" in systems.slurm.state["gpu01"].flags


def test_values_that_keep_the_guard_are_not_break_glass(make_bot: BotFactory) -> None:
    bot, _ = drain_bot(make_bot)
    for raw in ({}, {"min_free_gpus": "8", "requeue": "false"}, {"min_free_gpus": "16"}):
        plan = bot.plan("drain-node", {**DRAIN, **raw})
        assert not plan.break_glass and plan.approval.required == 1
        assert "weakened_guards" not in plan.body()  # plans without one keep their hashes
    plan = bot.plan("drain-node", DRAIN, break_glass=True)  # asked, but nothing to override
    assert not plan.break_glass and plan.approval.required == 1


def test_the_plan_names_the_weakened_guard(make_bot: BotFactory) -> None:
    bot, _ = drain_bot(make_bot)
    plan = bot.plan("drain-node", {**DRAIN, "min_free_gpus": "0", "requeue": "yes"},
                    break_glass=True)
    assert plan.approval.required == 2  # two weakened guards: still one break-glass approval
    text = plan_text(plan)
    assert f"break-glass: {WEAKENED}" in text
    assert "break-glass: requeue=true weakens a guard" in text
    assert "approval: 2 approval(s)" in text and "(break-glass: one more approval" in text
    assert f"• break-glass: {WEAKENED}" in capacity_lines(plan)  # what Slack shows approvers


@pytest.mark.parametrize("raw, break_glass", [
    ({}, False), ({}, True), ({"min_free_gpus": "0"}, True), ({"min_free_gpus": "40"}, True)])
def test_no_request_goes_under_the_site_floor(make_bot: BotFactory, raw: dict[str, str],
                                              break_glass: bool) -> None:
    bot, systems = drain_bot(make_bot, guards={"min_free_gpus": {"slurm": 30}})
    with pytest.raises(Refused, match=r"the site floor: .*Slurm pool: 32 free GPUs now, 24 after "
                                      r"taking gpu01 out \(floor \d+.*not even by break-glass"):
        bot.request("drain-node", {**DRAIN, **raw}, "alice", break_glass=break_glass)
    assert systems.slurm.calls == []


def test_break_glass_lowers_the_runbook_floor_down_to_the_site_floor(make_bot: BotFactory) -> None:
    bot, _ = drain_bot(make_bot, guards={"min_free_gpus": {"slurm": 20}})
    plan = bot.plan("drain-node", DRAIN)  # default 8, site 20: 24 left is enough
    assert not plan.break_glass
    with pytest.raises(Refused, match=r"floor 28\)\. To go ahead anyway ask for break-glass"):
        bot.plan("drain-node", {**DRAIN, "min_free_gpus": "28"})
    assert bot.plan("drain-node", {**DRAIN, "min_free_gpus": "28"}, break_glass=True).break_glass
    assert bot.plan("drain-node", {**DRAIN, "min_free_gpus": "0"}, break_glass=True).break_glass


class _DrainsWhenRunning:
    """A capacity evaluator that drains gpu02 once the execution runs: the pool drops under
    the site floor between the plan made at start and the pre-check."""

    def __init__(self, bot: Service, systems: Systems) -> None:
        self.bot, self.systems, self.execution_id = bot, systems, 0
        self.inner = CapacityEvaluator(bot.inventory, systems.slurm,
                                       site_floors=bot.config.guards.min_free_gpus)

    def __call__(self, check: Any, deadline: float) -> Any:
        if self.execution_id and self.bot.get(self.execution_id).state == "running":
            self.systems.slurm.update_nodes(["gpu02"], "DRAIN", "someone else")
        return self.inner(check, deadline)


def test_a_break_glass_pre_check_under_the_site_floor_fails(make_bot: BotFactory) -> None:
    bot, systems = drain_bot(make_bot, guards={"min_free_gpus": {"slurm": 20}})
    shrinking = _DrainsWhenRunning(bot, systems)
    bot.checks = Checks({"capacity": shrinking, "slurm": SlurmEvaluator(systems.slurm)},
                        sleep=lambda s: None)
    execution_id = bot.request("drain-node", {**DRAIN, "min_free_gpus": "0"}, "alice",
                               break_glass=True)
    shrinking.execution_id = execution_id
    bot.approve(execution_id, "carol")
    bot.approve(execution_id, "dave")
    ex = drive(bot, execution_id)
    assert ex.state == "failed"
    assert "capacity stays above the floor" in (ex.error or "")
    assert "16 after taking gpu01 out (floor 20, the site floor" in (ex.error or "")
    assert "DRAIN" not in systems.slurm.state["gpu01"].flags  # nothing was run

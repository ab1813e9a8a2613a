"""An approval names the plan the approver saw (``approve ID PLAN_HASH``, the Slack button's
hash): the service compares it in the approval's own compare-and-set, so a plan that changed
since (here: replaced under the approver) is refused, recorded, and not approved; a
malformed hash is refused before anything is read; the reply names the plan approved."""

from __future__ import annotations

import pytest

from bot.execution import executions
from bot.service import Service
from bot.store import audit
from bot.store.words import Kind, State
from bot.surfaces.chat import commands
from kit.errors import Refused
from tests.conftest import BotFactory

RUNBOOK = {
    "name": "drain", "version": "1.0.0", "summary": "drain a node", "risk": "medium",
    "params": {"node": {"type": "node", "required": True}},
    "locks": ["node:{{ node }}"],
    "approval": {"required": 1, "approvers": ["user:carol"], "expires": "30m"},
    "steps": [{"id": "note", "action": "chat.notify", "with": {"message": "drain {{ node }}"}}],
}


def requested(make_bot: BotFactory) -> tuple[Service, int, str]:
    bot = make_bot({"drain": RUNBOOK})
    execution_id = bot.request("drain", {"node": "gpu01"}, "alice")
    return bot, execution_id, bot.get(execution_id).plan_hash


def test_the_plan_the_approver_saw_is_approved(make_bot: BotFactory) -> None:
    bot, execution_id, shown = requested(make_bot)
    ex = bot.approve(execution_id, "carol", plan_hash=shown[:6].upper())
    assert ex.state == State.APPROVED and bot.approvals(execution_id) == ["carol"]
    reply = commands.handle(bot, "run drain node=gpu02", "alice").text
    second = int(reply.split()[1].rstrip(":"))
    assert f"approve {second} {bot.get(second).plan_hash[:12]}" in reply  # shown to approvers
    answer = commands.handle(bot, f"approve {second} {bot.get(second).plan_hash[:12]}",
                             "carol").text
    assert f"plan {bot.get(second).plan_hash[:12]}; now approved" in answer


def test_a_plan_that_changed_since_it_was_seen_is_not_approved(make_bot: BotFactory) -> None:
    bot, execution_id, shown = requested(make_bot)
    with bot.db.begin() as conn:  # the plan is replaced after carol looked at it
        assert executions.update_if(conn, execution_id, {"plan_hash": shown},
                                    plan_hash="f" * 64)
    with pytest.raises(Refused, match=f"the plan changed: execution {execution_id}'s plan is "
                                      f"now ffffffffffff, not the {shown[:12]} you approved"):
        bot.approve(execution_id, "carol", plan_hash=shown[:12])
    assert bot.approvals(execution_id) == []
    assert bot.get(execution_id).state == State.AWAITING_APPROVAL
    with bot.db.connect() as conn:
        refused = [e for e in audit.events(conn, execution_id=execution_id)
                   if e["kind"] == Kind.APPROVAL_REFUSED]
    assert refused and "the plan changed" in refused[-1]["data"]["reason"]
    assert "the plan changed" in commands.handle(
        bot, f"approve {execution_id} {shown[:8]}", "carol").text


@pytest.mark.parametrize("bad", ["abc", "xyz123", "3f9c1a; drop", "0" * 65, "plan="])
def test_a_malformed_hash_is_refused_and_changes_nothing(make_bot: BotFactory,
                                                         bad: str) -> None:
    bot, execution_id, _ = requested(make_bot)
    with pytest.raises(Refused, match="is not a plan hash"):
        bot.approve(execution_id, "carol", plan_hash=bad)
    assert bot.approvals(execution_id) == []


def policy(required: int, approvers: list[str], **extra: object) -> dict[str, object]:
    return {**RUNBOOK, "approval": {"required": required, "approvers": approvers,
                                    "expires": "30m", **extra}}


def test_a_request_fewer_named_people_could_approve_is_refused_at_once(
        make_bot: BotFactory) -> None:
    bot = make_bot({"drain": policy(2, ["user:carol", "user:dave"]),
                    "three": {**policy(3, ["user:carol", "user:dave"]), "name": "three"},
                    "own": {**policy(2, ["user:carol", "user:dave"], self_approval=True),
                            "name": "own"},
                    "group": {**policy(3, ["group:gpu-leads"]), "name": "group"}})
    with pytest.raises(Refused, match=r"drain needs 2 approvals but only 1 person\(s\) may "
                                      r"give one \(dave; carol asked and may not approve it\)"):
        bot.request("drain", {"node": "gpu01"}, "carol")
    with pytest.raises(Refused, match=r"three needs 3 approvals but only 2 person\(s\)"):
        bot.request("three", {"node": "gpu01"}, "alice")
    assert bot.request("drain", {"node": "gpu01"}, "alice")  # carol and dave: two
    assert bot.request("own", {"node": "gpu02"}, "carol")  # she may approve her own
    assert bot.request("group", {"node": "gpu03"}, "alice")  # a group: its size unknown here

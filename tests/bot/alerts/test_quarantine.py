"""Automatic quarantine inside the breaker: an XID the configuration lists (remediation.
quarantine.xids) runs the quarantine runbook at once, without a person, and still proposes
the XID table's repair for a person; an XID not listed only proposes; the breaker refuses
the quarantine with the proposal; a re-sent alert quarantines once; the audit log names the
alert behind each quarantine. The lab runs the shipped runbook on real Slurm and the
Kubernetes fake in tests/runbooks/test_quarantine.py."""

from __future__ import annotations

from typing import Any

from bot.alerts import proposing
from bot.execution.engine import Engine
from bot.service import Service
from bot.store.words import Kind
from tests.bot.alerts.test_remediation import RUNBOOKS, WIDE, XID_RULE, events, fire, ran
from tests.bot.alerts.test_remediation import remediation as runbook
from tests.conftest import BotFactory

QUARANTINE = runbook("quarantine-node", "drain")
QUARANTINE["params"] = {"node": {"type": "node", "required": True},
                        "reason": {"type": "text", "required": True}}


def make(make_bot: BotFactory, xids: list[int], **more: Any) -> Service:
    config = {**WIDE, "quarantine": {"xids": xids}, **more}
    return make_bot({**RUNBOOKS, "quarantine-node": QUARANTINE}, remediation=config,
                    alert_rules=[XID_RULE])


def quarantines(bot: Service) -> list[dict[str, Any]]:
    return [e for e in events(bot) if e["kind"] == Kind.QUARANTINE_REQUESTED]


def test_a_listed_xid_quarantines_at_once_and_proposes_the_repair(
        make_bot: BotFactory) -> None:
    bot = make(make_bot, [79])
    [proposal] = fire(bot, "GpuXid", "fp-79-gpu02", node="gpu02", gpu="3", xid="79")
    assert (proposal.state, proposal.runbook) == ("open", "swap-gpu")  # for a person
    [event] = quarantines(bot)
    execution = bot.get(event["execution_id"])
    assert execution.runbook == "quarantine-node" and execution.requested_by == "alertmanager"
    assert execution.params["node"] == "gpu02"
    assert execution.params["reason"] == "GpuXid XID 79 on GPU 3 (alert fp-79-gpu02)"
    assert execution.state == "approved"  # risk low: no person needed to start it
    assert event["data"]["fingerprint"] == "fp-79-gpu02" and event["data"]["xid"] == 79
    assert f"quarantined by execution {execution.id}" in (proposal.note or "")
    engine = Engine(bot, sleep=lambda s: None)
    assert engine.drive(execution.id).state == "succeeded"
    engine.close()


def test_an_xid_not_listed_only_proposes(make_bot: BotFactory) -> None:
    bot = make(make_bot, [79])
    [proposal] = fire(bot, "GpuXid", "fp-48", node="gpu02", gpu="3", xid="48")
    assert proposal.runbook == "reset-gpu" and proposal.state == "open"
    assert quarantines(bot) == []


def test_a_resent_alert_quarantines_once(make_bot: BotFactory) -> None:
    bot = make(make_bot, [79])
    fire(bot, "GpuXid", "fp-again", node="gpu02", gpu="3", xid="79")
    fire(bot, "GpuXid", "fp-again", node="gpu02", gpu="3", xid="79")
    assert len(quarantines(bot)) == 1


def test_the_breaker_refuses_the_quarantine_with_the_proposal(make_bot: BotFactory) -> None:
    bot = make(make_bot, [79], breaker={"max_pool_share": 0.25, "max_nodes_per_hour": 100})
    assert ran(bot, "drain-node", "gpu01").state == "succeeded"
    assert ran(bot, "drain-node", "gpu03").state == "succeeded"  # 2 of 4 held out
    [stopped] = fire(bot, "GpuXid", "fp-stopped", node="gpu02", gpu="3", xid="79")
    assert stopped.state == "refused" and "breaker" in (stopped.note or "")
    assert quarantines(bot) == []


def test_a_quarantine_the_bot_cannot_request_is_said_on_the_proposal(
        make_bot: BotFactory) -> None:
    bot = make_bot(RUNBOOKS, remediation={**WIDE, "quarantine": {"xids": [79]}},
                   alert_rules=[XID_RULE])  # no quarantine runbook here
    [proposal] = fire(bot, "GpuXid", "fp-none", node="gpu02", gpu="3", xid="79")
    assert proposal.state == "open" and "quarantine refused" in (proposal.note or "")
    [event] = quarantines(bot)
    assert event["execution_id"] is None
    assert proposing.get(bot, proposal.id).runbook == "swap-gpu"


def test_a_long_or_multi_line_alertname_still_quarantines(make_bot: BotFactory) -> None:
    rule = {**XID_RULE, "match": {"xid": "79"}}
    bot = make_bot({**RUNBOOKS, "quarantine-node": QUARANTINE},
                   remediation={**WIDE, "quarantine": {"xids": [79]}}, alert_rules=[rule])
    fire(bot, "Gpu\nXid " + "x" * 300, "fp-long", node="gpu02", gpu="3", xid="79")
    [event] = quarantines(bot)
    assert event["execution_id"] is not None, event["data"]["outcome"]
    reason = bot.get(event["execution_id"]).params["reason"]
    assert "\n" not in reason and len(reason) < 150

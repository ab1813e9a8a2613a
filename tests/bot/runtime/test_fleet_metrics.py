"""/metrics about the fleet and the automation (bot/runtime/fleetmetrics.py): nodes the bot's
executions hold out (a drain holds its node, a resume returns it), alerts turned into
proposals by alert name and proposals by state, and the breaker, 0 until it trips."""

from __future__ import annotations

from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bot.alerts import proposing
from bot.alerts.proposing import Webhook, WebhookAlert
from bot.execution.engine import Engine
from bot.runtime import metrics
from bot.service import Service
from tests.bot import fakes
from tests.conftest import BotFactory


def remediation(name: str, kind: str) -> dict[str, Any]:
    return {"name": name, "version": "1.0.0", "summary": name, "risk": "low",
            "remediation": kind, "params": {"node": {"type": "node", "required": True}},
            "steps": [{"id": "a", "action": "test.record",
                       "with": {"key": f"{name}-{{{{ node }}}}"}}]}


def samples(bot: Service) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry, _ = metrics.registry_for(bot)
    body = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def drive(bot: Service, runbook: str, node: str) -> None:
    execution_id = bot.request(runbook, {"node": node}, "alice")
    engine = Engine(bot, sleep=lambda s: None)
    try:
        assert engine.drive(execution_id).state == "succeeded"
    finally:
        engine.close()


def alert(bot: Service, name: str, node: str, n: int) -> None:
    firing = WebhookAlert.model_validate({
        "status": "firing", "labels": {"alertname": name, "node": node},
        "fingerprint": f"f{n}", "startsAt": f"2026-12-02T00:00:{n:02d}Z"})
    proposing.receive(bot, Webhook(version="4", status="firing", alerts=[firing]))


def test_nodes_held_out_proposals_and_the_breaker(make_bot: BotFactory) -> None:
    fakes.reset()
    bot = make_bot({"drain-node": remediation("drain-node", "drain"),
                    "resume-node": remediation("resume-node", "resume")},
                   alert_rules=[{"match": {"alertname": "Hot|Xid"}, "runbook": "drain-node",
                                 "params": {"node": "{{ labels.node }}"}}],
                   remediation={"breaker": {"max_pool_share": 0.9,
                                             "max_nodes_per_hour": 2}})
    before = samples(bot)
    assert before[("runbook_nodes_held_out", ())] == 0
    assert before[("runbook_breaker_tripped", ())] == 0
    assert before[("runbook_proposals", (("state", "open"),))] == 0
    assert not [k for k in before if k[0] == "runbook_proposals_created_total"]
    drive(bot, "drain-node", "gpu01")
    drive(bot, "drain-node", "gpu02")
    drive(bot, "resume-node", "gpu01")
    assert samples(bot)[("runbook_nodes_held_out", ())] == 1  # gpu02
    alert(bot, "Hot", "gpu03", 1)
    alert(bot, "Xid", "gpu03", 2)
    drive(bot, "drain-node", "gpu03")  # three taken out within the hour
    alert(bot, "Hot", "gpu04", 3)  # past max_nodes_per_hour: refused, and the breaker trips
    after = samples(bot)
    assert after[("runbook_breaker_tripped", ())] == 1
    assert after[("runbook_nodes_held_out", ())] == 2
    assert after[("runbook_proposals_created_total", (("alertname", "Hot"),))] == 2
    assert after[("runbook_proposals_created_total", (("alertname", "Xid"),))] == 1
    assert after[("runbook_proposals", (("state", "open"),))] == 2
    assert after[("runbook_proposals", (("state", "refused"),))] == 1
    assert after[("runbook_proposals", (("state", "dismissed"),))] == 0

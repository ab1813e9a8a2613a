"""Change references (policy.require_change, issue 28): a request of a runbook at a listed risk
without a change=REF, or with one the pattern refuses, is refused before any plan is made,
through the service, the chat and schedules and windows at creation, changing nothing; the
reference is in the plan (its text, the Slack card), its hash binds it, the requested event
and the execution row hold it, a run replans with it, and alert rules carry it as a parameter;
a runbook may not name a parameter "change"."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import func, select

from bot.alerts import proposing
from bot.config import Config
from bot.execution.engine import Engine
from bot.runbooks.catalogue import Catalogue
from bot.runbooks.loading import RunbookError, load_text
from bot.schedule import scheduling, windows
from bot.service import Service
from bot.store import audit
from bot.store.schema import executions, locks, maintenance_windows, schedules
from bot.surfaces import rendering
from bot.surfaces.chat import commands
from bot.surfaces.chat.words import runbook_list
from bot.surfaces.slack.blocks import plan_message
from kit.errors import Refused
from tests.bot import fakes
from tests.bot.execution.test_engine import record, runbook
from tests.bot.schedule.test_windows import RUNBOOKS
from tests.bot.schedule.windowfakes import Systems
from tests.conftest import BotFactory

POLICY = {"require_change": True}  # the default pattern ^(CHG|INC)[0-9]{4,10}$, risks [high]
RULE: dict[str, Any] = {"match": {"alertname": "GpuXidFallenOffBus"}, "runbook": "risky",
        "params": {"node": "{{ labels.node }}"}}


@pytest.fixture(autouse=True)
def _clean() -> None:
    fakes.reset()


def risky() -> dict[str, Any]:
    return runbook([record("a", "{{ node }}")], risk="high", name="risky")


def rows(bot: Service, table: Any) -> int:
    with bot.db.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def events(bot: Service) -> list[dict[str, Any]]:
    with bot.db.connect() as conn:
        return list(audit.events(conn))


@pytest.fixture
def bot(make_bot: BotFactory) -> Service:
    return make_bot({"risky": risky(), "demo": runbook([record("a", "{{ node }}")],
                                                       risk="medium")}, policy=POLICY)


BAD = [({}, "needs a change or incident reference"),
       ({"change": "  "}, "needs a change or incident reference"),
       ({"change": "CHG12"}, "does not match"),  # too few digits
       ({"change": "CHG-1234"}, "does not match"),
       ({"change": "chg1234"}, "does not match"), ({"change": "CHG" + "1" * 70}, "does not")]


@pytest.mark.parametrize(("extra", "said"), BAD)
def test_a_request_without_a_good_reference_is_refused_changing_nothing(
        bot: Service, extra: dict[str, str], said: str) -> None:
    with pytest.raises(Refused, match=said) as caught:
        bot.request("risky", {"node": "gpu01", **extra}, "alice")
    assert "^(CHG|INC)[0-9]{4,10}$" in str(caught.value)  # the message names the pattern
    assert (rows(bot, executions), rows(bot, locks)) == (0, 0)
    assert [e["kind"] for e in events(bot) if e["kind"] != "runbook_version_recorded"] == [
        "refused"]
    with pytest.raises(Refused, match=said):  # the plan a person previews, likewise
        bot.plan("risky", {"node": "gpu01", **extra})
    reply = commands.handle(bot, " ".join(["run risky node=gpu01",
                                           *(f"{k}={v}" for k, v in extra.items() if v.strip())
                                           ]), "alice")
    assert not reply.ok and "change" in reply.text and rows(bot, executions) == 0


def test_a_risk_not_listed_needs_none_but_a_reference_given_is_checked(bot: Service) -> None:
    assert bot.request("demo", {"node": "gpu01"}, "alice") > 0
    with pytest.raises(Refused, match="does not match"):
        bot.request("demo", {"node": "gpu02", "change": "TICKET-1"}, "alice")
    ex = bot.get(bot.request("demo", {"node": "gpu02", "change": "INC00042"}, "alice"))
    assert ex.plan.change == "INC00042" and ex.change == "INC00042"


def test_the_reference_is_planned_bound_by_the_hash_shown_and_recorded(bot: Service) -> None:
    first = bot.plan("risky", {"node": "gpu01", "change": "CHG0001"})
    second = bot.plan("risky", {"node": "gpu01", "change": "CHG0002"})
    assert (first.change, second.change) == ("CHG0001", "CHG0002")
    assert first.hash != second.hash and first.params == second.params
    assert "change: CHG0001" in rendering.plan_text(first)  # runbook plan, the chat's plan
    execution_id = bot.request("risky", {"node": "gpu01", "change": "CHG0001"}, "alice")
    ex = bot.get(execution_id)
    assert ex.plan_hash == first.hash and ex.change == "CHG0001"
    assert "change" not in ex.params  # a reference, not a parameter of the runbook
    requested = [e for e in events(bot) if e["kind"] == "requested"]
    assert requested[0]["data"]["change"] == "CHG0001"
    assert "CHG0001" in json.dumps(plan_message(ex, ["carol"]).blocks)  # the Slack card


def test_a_run_replans_with_its_reference_and_the_approvals_hold(bot: Service) -> None:
    execution_id = bot.request("risky", {"node": "gpu01", "change": "CHG0001"}, "alice")
    bot.approve(execution_id, "carol")
    bot.approve(execution_id, "dave")
    engine = Engine(bot, sleep=lambda s: None)
    try:
        assert engine.drive(execution_id).state == "succeeded"
    finally:
        engine.close()
    assert fakes.JOURNAL == [("test.record", "gpu01")]


def test_a_schedule_needs_one_at_creation_and_keeps_it(bot: Service) -> None:
    for extra in ({}, {"change": "nope"}):
        with pytest.raises(Refused, match="change"):
            scheduling.add(bot, "risky", {"node": "gpu01", **extra}, "alice", cron="0 2 * * *")
    assert rows(bot, schedules) == 0
    added = scheduling.add(bot, "risky", {"node": "gpu01", "change": "CHG0001"}, "alice",
                           cron="0 2 * * *")
    assert added.plan_hash == bot.plan("risky", {"node": "gpu01", "change": "CHG0001"}).hash


def test_a_window_needs_one_for_each_such_runbook(make_bot: BotFactory) -> None:
    systems = Systems(["gpu01", "gpu02", "gpu03", "gpu04"], ["gpu04"])
    made = make_bot({"open-window": (RUNBOOKS / "open-window.yaml").read_text(),
                     "close-window": (RUNBOOKS / "close-window.yaml").read_text(),
                     "risky": risky()}, policy=POLICY)
    made.catalogue = Catalogue([*made.catalogue._actions.values(), *systems.actions()])
    bot = systems.guarding(made)
    for spec in ("risky node=gpu03", "risky node=gpu03 change=X1"):
        with pytest.raises(Refused, match="change"):
            windows.create(bot, "gpu03", "alice", start="2030-01-01 02:00", duration="2h",
                           runbooks=runbook_list(spec))
    assert rows(bot, maintenance_windows) == 0
    window = windows.create(bot, "gpu03", "alice", start="2030-01-01 02:00", duration="2h",
                            runbooks=[("risky", {"node": "gpu03", "change": "CHG0001"})])
    assert window.plans[-1]["params"]["change"] == "CHG0001"  # asked again as it fires


def alert(node: str, incident: str | None = None) -> proposing.Webhook:
    labels = {"alertname": "GpuXidFallenOffBus", "node": node,
              **({"incident": incident} if incident else {})}
    return proposing.Webhook.model_validate({
        "version": "4", "status": "firing", "receiver": "bot", "groupKey": "{}:{}",
        "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
        "externalURL": "http://alertmanager", "alerts": [{
        "status": "firing", "labels": labels, "annotations": {}, "fingerprint": node,
        "startsAt": "2026-12-01T00:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": ""}]})


def test_an_alert_rule_carries_the_reference_as_a_parameter(make_bot: BotFactory) -> None:
    bare = make_bot({"risky": risky()}, policy=POLICY, alert_rules=[RULE])
    proposing.receive(bare, alert("gpu01"))  # refused: the rule gives no reference
    assert proposing.listing(bare) == [] and rows(bare, executions) == 0
    refused = [e for e in events(bare) if e["kind"] == "proposal_refused"]
    assert "needs a change or incident reference" in refused[0]["data"]["reason"]
    rule = {**RULE, "params": {**RULE["params"], "change": "{{ labels.incident }}"}}
    bot = make_bot({"risky": risky()}, policy=POLICY, alert_rules=[rule])
    proposing.receive(bot, alert("gpu02", "INC20260001"))
    [proposal] = proposing.listing(bot)
    ex = bot.get(proposing.run(bot, proposal.id, "alice"))
    assert ex.change == "INC20260001" and ex.plan.params == {"node": "gpu02"}


def test_change_is_a_reserved_word_and_the_pattern_is_checked(tmp_path: Any) -> None:
    body = runbook([record("a", "a")], params={"change": {"type": "text"}})
    with pytest.raises(RunbookError, match='"change" is reserved'):
        load_text(json.dumps(body), tmp_path / "demo.yaml", Catalogue([]).arguments())
    with pytest.raises(ValueError, match="not a regular expression"):
        Config.model_validate({"policy": {"change_pattern": "(CHG"}})
    with pytest.raises(ValueError, match="change_risks"):
        Config.model_validate({"policy": {"change_risks": ["severe"]}})

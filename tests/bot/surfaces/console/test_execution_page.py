"""/ui/executions/{id}: a real execution (approved, a pre-check, a confirmation, a step
retried then failed, the undo) shown through the real application: the plan, the approval
bound to its hash, attempts, checks, the undo, the confirmation, the runbook version's diff
link, every event verified; an event edited in the database flagged, and only it; a
cancel and who did it; malformed IDs; a secret parameter never shown."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, select, update

from bot.execution.engine import Engine
from bot.service import Service
from bot.store.schema import audit_events
from bot.surfaces.chat import commands
from bot.surfaces.console.identity import Viewer
from bot.surfaces.console.scope import MASK, visible
from tests.bot import fakes
from tests.bot.surfaces.console.pagehelp import Element, as_user, client, overrides, parse
from tests.conftest import BotFactory, lab_config

SECRET = "s3cr3t-T0KEN-value"


@pytest.fixture(autouse=True)
def _clean() -> None:
    fakes.reset()


def runbook(version: str = "1.0.0") -> dict[str, Any]:
    return {
        "name": "demo", "version": version, "summary": f"console test {version}",
        "risk": "medium",
        "params": {"node": {"type": "node", "required": True},
                   "api_token": {"type": "text", "required": True}},
        "pre_checks": [{"name": "host answers", "command": "probe", "expect": "== 0"}],
        "steps": [
            {"id": "a", "action": "test.record", "with": {"key": "{{ node }}-a"},
             "undo": {"action": "test.forget", "with": {"key": "{{ node }}-a"}}},
            {"id": "t", "action": "test.record", "with": {"key": "tok-{{ api_token }}"}},
            {"id": "ask", "action": "chat.confirm",
             "with": {"question": "GPU reseated on {{ node }}?", "poll": 0.02}},
            {"id": "b", "action": "test.flaky", "with": {"key": "b"}, "retries": 1,
             "retry_delay": "0s"},
        ],
    }


def make(make_bot: BotFactory, url: str | None = None, version: str = "1.0.0") -> Service:
    return make_bot({"demo": runbook(version)}, url, host_commands={"probe": {"argv": ["true"]}},
                    **overrides())


def run_failing(bot: Service) -> int:
    """alice asks, carol approves; the engine runs it; alice answers the question; step b
    fails twice, so step a is undone."""
    fakes.FAILURES["b"] = 99
    execution_id = bot.request("demo", {"node": "gpu02", "api_token": SECRET}, "alice")
    bot.approve(execution_id, "carol")
    engine = Engine(bot, sleep=lambda s: None)
    worker = threading.Thread(target=engine.drive, args=(execution_id,))
    worker.start()
    deadline = time.monotonic() + 10
    while not _has(bot, execution_id, "confirmation_requested"):
        assert time.monotonic() < deadline, "the question was never asked"
        time.sleep(0.02)
    bot.confirm(execution_id, "alice", True, "reseated by DC tech")
    worker.join(10)
    engine.close()
    assert bot.get(execution_id).state == "failed"
    return execution_id


def _has(bot: Service, execution_id: int, kind: str) -> bool:
    with bot.db.connect() as conn:
        return conn.execute(select(audit_events.c.seq).where(
            audit_events.c.execution_id == execution_id, audit_events.c.kind == kind)
        ).first() is not None


def page(bot: Service, path: str, user: str = "erin", status: int = 200) -> Element:
    answer = client(bot).get(path, headers=as_user(user))
    assert answer.status_code == status, answer.text[:2000]
    assert SECRET not in answer.text
    return parse(answer.text)


def section_table(doc: Element, heading_id: str) -> Element:
    """The first table after the heading with this id."""
    seen = False
    for element in doc.walk():
        if element.attrs.get("id") == heading_id:
            seen = True
        elif seen and element.tag == "table":
            return element
    raise AssertionError(f"no table after #{heading_id}")


def event_rows(doc: Element) -> dict[int, Element]:
    table = doc.one("table", "events")
    return {int(row.attrs["id"].removeprefix("event-")): row
            for row in table.all("tr") if row.attrs.get("id", "").startswith("event-")}


def test_the_page_tells_the_whole_execution(make_bot: BotFactory) -> None:
    bot = make(make_bot)
    execution_id = run_failing(bot)
    ex = bot.get(execution_id)
    doc = page(bot, f"/ui/executions/{execution_id}")
    assert "failed" in doc.one("h1").text()
    plan = section_table(doc, "plan")
    assert [row[1] for row in plan.rows()] == ["a", "t", "ask", "b"]
    assert plan.rows()[0][3] == "record gpu02-a" and plan.rows()[0][4] == "forget gpu02-a"
    assert plan.rows()[1][3] == f"record tok-{MASK}"  # the secret inside an operation
    assert any(e.attrs.get("title") == ex.plan_hash for e in doc.all("code", "hash"))
    (approval,) = section_table(doc, "approvals").rows()
    assert approval[:2] == ["carol", "approved"] and approval[3] == "cli"
    assert ex.plan_hash[:12] in approval[4] and "(this plan)" in approval[4]
    steps = section_table(doc, "steps").rows()
    assert [(r[0].split()[0], r[1], r[4]) for r in steps] == [
        ("a", "1", "succeeded"), ("t", "1", "succeeded"), ("ask", "1", "succeeded"),
        ("b", "1", "failed (retried)"), ("b", "2", "failed")]
    assert all(r[3] != "–" for r in steps)  # each took some time
    undo = section_table(doc, "undo").rows()
    assert [(r[0].split()[0], r[4]) for r in undo] == [("a", "succeeded")]
    assert "step b failed" in doc.text()
    (check,) = section_table(doc, "checks").rows()
    assert check[0] == "pre-check" and check[1].startswith("host answers")
    assert "probe" in check[2] and check[3] == "== 0" and check[4] == "0"
    assert check[5].startswith("passed")
    (question,) = section_table(doc, "confirmations").rows()
    assert question[:5] == ["ask", "GPU reseated on gpu02?", question[2], "yes", "alice"]
    assert question[6] == "reseated by DC tech"
    marks = {seq: row.all("td")[5].text() for seq, row in event_rows(doc).items()}
    assert len(marks) > 15 and set(marks.values()) == {"✓ verified"}
    assert not doc.all("p", "problem")


def test_an_edited_event_is_flagged_and_only_it(make_bot: BotFactory) -> None:
    bot = make(make_bot)
    execution_id = run_failing(bot)
    with bot.db.begin() as conn:
        edited = conn.execute(select(audit_events.c.seq).where(
            audit_events.c.execution_id == execution_id,
            audit_events.c.kind == "check_evaluated")).scalar_one()
        conn.execute(update(audit_events).where(audit_events.c.seq == edited).values(
            data=audit_events.c.data.op("||")("")))  # unchanged first: still verified
    assert _marks(bot, execution_id)[edited] == "✓ verified"
    with bot.db.begin() as conn:
        raw = conn.execute(select(audit_events.c.data)
                           .where(audit_events.c.seq == edited)).scalar_one()
        conn.execute(update(audit_events).where(audit_events.c.seq == edited)
                     .values(data=raw.replace('"passed":true', '"passed":false')))
    marks = _marks(bot, execution_id)
    assert marks[edited] == "✗ edited: hash does not match its content"
    assert {seq for seq, mark in marks.items() if mark != "✓ verified"} == {edited}
    doc = page(bot, f"/ui/executions/{execution_id}")
    (alert,) = doc.all("p", "problem")
    assert f"event {edited}" in alert.text() and alert.attrs["role"] == "alert"
    assert event_rows(doc)[edited].attrs["class"] == "flagged"


def test_a_deleted_event_breaks_the_link_of_the_next(make_bot: BotFactory) -> None:
    bot = make(make_bot)
    execution_id = run_failing(bot)
    seqs = sorted(_marks(bot, execution_id))
    gone = seqs[3]
    with bot.db.begin() as conn:
        conn.execute(delete(audit_events).where(audit_events.c.seq == gone))
    marks = _marks(bot, execution_id)
    assert marks[gone + 1] == f"✗ event {gone} before it is missing: deleted"
    assert {seq for seq, mark in marks.items() if mark != "✓ verified"} == {gone + 1}


def _marks(bot: Service, execution_id: int) -> dict[int, str]:
    doc = page(bot, f"/ui/executions/{execution_id}")
    return {seq: row.all("td")[5].text() for seq, row in event_rows(doc).items()}


def test_an_approval_and_a_denial_say_the_surface_they_came_from(make_bot: BotFactory
                                                                  ) -> None:
    bot = make(make_bot)
    approved = bot.request("demo", {"node": "gpu01", "api_token": SECRET}, "alice")
    assert "approved by carol" in commands.handle(bot, f"approve {approved}", "carol").text
    denied = bot.request("demo", {"node": "gpu03", "api_token": SECRET}, "alice")
    bot.deny(denied, "carol", "not tonight")
    (row,) = section_table(page(bot, f"/ui/executions/{approved}"), "approvals").rows()
    assert row[:4] == ["carol", "approved", row[2], "chat"]
    (row,) = section_table(page(bot, f"/ui/executions/{denied}"), "approvals").rows()
    assert row[:4] == ["carol", "denied", row[2], "cli"] and row[5] == "not tonight"


def test_a_cancel_shows_who_cancelled(make_bot: BotFactory) -> None:
    bot = make(make_bot)
    execution_id = bot.request("demo", {"node": "gpu01", "api_token": SECRET}, "alice")
    bot.cancel(execution_id, "dave")
    doc = page(bot, f"/ui/executions/{execution_id}", user="alice")
    steering = section_table(doc, "steering").rows()
    assert [row[1:3] for row in steering] == [
        ["alice", "requested"], ["dave", "cancel requested"], ["dave", "finished"]]
    assert "cancelled by dave" in doc.text()
    assert section_table(doc, "approvals").rows() == [["No approval or denial."]]
    params = doc.one("dl", "facts").text()
    assert f"api_token={MASK}" in params and "node=gpu01" in params
    assert "/ui/nodes/gpu01" in {a.attrs["href"] for a in doc.one("dl", "facts").all("a")}


def test_the_version_links_to_its_diff_with_the_one_before(make_bot: BotFactory,
                                                           sqlite_url: str) -> None:
    make(make_bot, sqlite_url).runbooks()  # 1.0.0 seen first
    bot = make(make_bot, sqlite_url, version="1.1.0")
    execution_id = bot.request("demo", {"node": "gpu01", "api_token": SECRET}, "alice")
    doc = page(bot, f"/ui/executions/{execution_id}")
    links = [a.attrs["href"] for a in doc.one("dl", "facts").all("a")]
    diff = "/ui/runbooks/demo/diff?from=1.0.0&to=1.1.0"
    assert diff in links
    assert client(bot).get(diff, headers=as_user("erin")).status_code == 200


def test_a_malformed_or_unknown_id_is_a_clear_page_not_a_500(make_bot: BotFactory) -> None:
    bot = make(make_bot)
    for path, status in [
            ("/ui/executions/abc", 400), ("/ui/executions/-1", 400), ("/ui/executions/1.5", 400),
            ("/ui/executions/%D9%A1", 400), ("/ui/executions/99999999999999999999", 404),
            ("/ui/executions/9223372036854775807", 404), ("/ui/executions/424242", 404)]:
        doc = page(bot, path, status=status)
        assert doc.one("h1").text() == str(status), path
        assert doc.one("p", "problem").text(), path


def test_who_sees_an_execution() -> None:
    config = lab_config("sqlite://", Path("."), requesters=["group:oncall"])
    assert visible(Viewer("erin", auditor=True), "demo", config)
    assert visible(Viewer("alice", auditor=False), "demo", config)  # oncall: a requester
    assert not visible(Viewer("carol", auditor=False), "demo", config)  # not a requester

"""/ui/chain, for auditors only: "Verify now" walks the chain, records a chain_verified
event (who, what it found) and sends the browser back; the page shows the last result, the
head, the checkpoint file against the log (none, agreeing, a cut tail) and the archives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import delete, func, select, update

from bot.execution.engine import Engine
from bot.service import Service
from bot.store import archive, audit, checkpoints
from bot.store.schema import audit_events
from bot.store.words import Kind
from bot.surfaces.console import chain_page
from tests.bot import fakes
from tests.bot.surfaces.console.pagehelp import (
    Element,
    as_user,
    client,
    form_headers,
    overrides,
    parse,
)
from tests.conftest import BotFactory

RUNBOOK = {"name": "demo", "version": "1.0.0", "summary": "chain test", "risk": "low",
           "params": {"node": {"type": "node", "required": True}},
           "steps": [{"id": "a", "action": "test.record", "with": {"key": "{{ node }}"}}]}


@pytest.fixture(autouse=True)
def _clean() -> None:
    fakes.reset()


@pytest.fixture
def checkpoint_file(tmp_path: Path) -> Path:
    return tmp_path / "checkpoints" / "audit.jsonl"


@pytest.fixture
def bot(make_bot: BotFactory, checkpoint_file: Path) -> Service:
    bot = make_bot({"demo": RUNBOOK}, **overrides(audit={"checkpoint_file": str(checkpoint_file)}))
    engine = Engine(bot, sleep=lambda s: None)
    for node in ("gpu01", "gpu02"):
        engine.drive(bot.request("demo", {"node": node}, "alice"))
    engine.close()
    return bot


def chain(bot: Service, user: str = "erin", status: int = 200) -> Element:
    answer = client(bot).get("/ui/chain", headers=as_user(user))
    assert answer.status_code == status, answer.text[:2000]
    return parse(answer.text)


def verify_now(bot: Service, user: str = "erin", status: int = 303) -> None:
    answer = client(bot).post("/ui/chain/verify", headers=form_headers(user))
    assert answer.status_code == status, answer.text[:2000]
    if status == 303:
        assert answer.headers["location"] == "/ui/chain"


def verifications(bot: Service) -> list[dict[str, object]]:
    with bot.db.connect() as conn:
        return [{**event["data"], "actor": event["actor"]} for event in audit.events(conn)
                if event["kind"] == Kind.CHAIN_VERIFIED]


def facts(doc: Element, heading: str) -> dict[str, str]:
    section = next(s for s in doc.all("section") if s.attrs.get("aria-labelledby") == heading)
    terms = [e.text() for e in section.all("dt")]
    return dict(zip(terms, [e.text() for e in section.all("dd")], strict=True))


def test_only_auditors_see_the_chain_or_run_a_verification(bot: Service) -> None:
    assert "for auditors" in chain(bot, user="alice", status=403).one("p", "problem").text()
    verify_now(bot, user="alice", status=403)
    assert verifications(bot) == []
    answer = client(bot).post("/ui/chain/verify", headers=as_user("erin"))  # no Origin
    assert answer.status_code == 403 and verifications(bot) == []
    assert not [a for a in parse(client(bot).get("/ui/executions", headers=as_user(
        "alice")).text).all("a") if a.attrs.get("href") == "/ui/chain"]


def test_verify_now_is_recorded_and_shown(bot: Service) -> None:
    doc = chain(bot)
    assert "has not been verified from the console yet" in doc.text()
    with bot.db.connect() as conn:
        seq, head = audit.last(conn) or (0, "")
    verify_now(bot)
    (recorded,) = verifications(bot)
    assert recorded == {"ok": True, "checked": seq, "head": head, "problem": "",
                        "problem_seq": None, "by": "erin", "surface": "console",
                        "actor": "erin"}
    doc = chain(bot)
    status = doc.one("p", "ok")
    assert status.attrs["role"] == "status"
    assert f"Intact when last verified: {seq} events checked" in status.text()
    assert status.text().endswith("by erin.")
    assert facts(doc, "head")["Last event"] == str(seq + 1)  # the verification's own event
    assert audit.verify(bot.db).ok  # recording it kept the chain whole


def test_a_broken_chain_is_said_loudly(bot: Service) -> None:
    with bot.db.begin() as conn:
        conn.execute(update(audit_events).where(audit_events.c.seq == 3)
                     .values(actor="mallory"))
    verify_now(bot)
    verify_now(bot)
    latest = verifications(bot)[-1]
    assert latest["ok"] is False and latest["problem_seq"] == 3
    doc = chain(bot)
    alert = doc.one("p", "problem")
    assert alert.attrs["role"] == "alert"
    assert "BROKEN" in alert.text() and "event 3 was edited" in alert.text()
    history = next(t for t in doc.all("table") if "Latest verifications" in t.text()).rows()
    assert len(history) == 2 and all("broken" in row[2] for row in history)


def test_checkpoints_none_agreeing_and_a_cut_tail(bot: Service, checkpoint_file: Path) -> None:
    assert facts(chain(bot), "checkpoints")["Against the log"] == (
        "no checkpoint has been written to it yet")
    point = checkpoints.record(bot.db, checkpoint_file)
    assert point is not None
    found = facts(chain(bot), "checkpoints")
    assert found["File"] == str(checkpoint_file) and found["Checkpoints"] == "1"
    assert f"event {point.seq}" in found["Last checkpoint"]
    assert found["Against the log"] == "✓ the log agrees with every checkpoint"
    with bot.db.begin() as conn:
        conn.execute(delete(audit_events).where(audit_events.c.seq == point.seq))
    against = facts(chain(bot), "checkpoints")["Against the log"]
    assert against.startswith("✗") and "its tail was cut off" in against
    checkpoint_file.write_text("not json\n")
    assert "line 1: not a checkpoint" in facts(chain(bot), "checkpoints")["Against the log"]


def test_no_checkpoint_file_configured(make_bot: BotFactory) -> None:
    bot = make_bot({"demo": RUNBOOK}, **overrides())
    assert "no checkpoint file is configured" in facts(chain(bot), "checkpoints")[
        "Against the log"]


def test_archives_are_listed_and_the_log_starts_after_them(bot: Service,
                                                          tmp_path: Path) -> None:
    with bot.db.connect() as conn:
        archived_up_to = conn.execute(select(func.max(audit_events.c.seq))).scalar_one()
    done = archive.archive(bot.db, "9999-01-01", tmp_path / "old.jsonl", "erin")
    doc = chain(bot)
    table = next(t for t in doc.all("table") if "Events moved out" in t.text())
    (row,) = table.rows()
    assert row[0] == f"1–{archived_up_to}" and row[2] == str(tmp_path / "old.jsonl")
    assert row[1] == done.head_hash[:16] + "…" and row[3] == done.sha256[:16] + "…"
    assert row[5] == "erin"
    titles = {code.attrs.get("title") for code in table.all("code")}
    assert {done.head_hash, done.sha256} <= titles
    assert facts(doc, "head")["The log starts at"].startswith(f"event {archived_up_to + 1}")
    verify_now(bot)
    assert verifications(bot)[-1]["ok"] is True
    header = json.loads((tmp_path / "old.jsonl").read_text().splitlines()[0])
    assert header["head_hash"] == done.head_hash


def test_one_verification_at_a_time(bot: Service) -> None:
    assert chain_page._VERIFYING.acquire(blocking=False)  # one is running now
    try:
        verify_now(bot)  # a second click: sent back, nothing run twice
        assert verifications(bot) == []
        assert "A verification is running now" in chain(bot).all("p", "warn")[0].text()
    finally:
        chain_page._VERIFYING.release()
    verify_now(bot)
    assert len(verifications(bot)) == 1

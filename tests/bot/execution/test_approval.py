"""Who may decide on a run, and what the engine checks again itself: a requester who is also
an approver may deny their own request but never approve it unless the policy says so; the
engine never starts a run short of approvals, and holds one that lost its locks."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import update

from bot.execution import executions
from bot.execution.engine import Engine
from bot.store import audit
from bot.store.schema import executions as executions_table
from bot.store.schema import locks
from bot.store.words import State
from kit.errors import Refused
from tests.bot import fakes
from tests.bot.execution.bounded import drive, run_pending_once
from tests.bot.execution.test_engine import record, runbook
from tests.conftest import BotFactory


def test_a_requester_who_approves_may_deny_their_own_request(make_bot: BotFactory) -> None:
    bot = make_bot({"demo": runbook([record("a", "a")], risk="medium")})
    first = bot.request("demo", {"node": "gpu01"}, "carol")  # carol is a gpu-lead
    with pytest.raises(Refused, match=r"carol requested execution \d+ and may not approve it"):
        bot.approve(first, "carol")
    denied = bot.deny(first, "carol", "wrong node")
    assert denied.state == "denied" and denied.error == "denied by carol: wrong node"
    second = bot.request("demo", {"node": "gpu02"}, "alice")
    with pytest.raises(Refused, match="bob may not approve demo"):
        bot.deny(second, "bob", "not an approver")  # nor deny: bob is not an approver
    assert bot.get(second).state == "awaiting_approval"


def test_the_engine_itself_never_starts_a_run_short_of_approvals(make_bot: BotFactory) -> None:
    """The service's gate skipped (a row written approved by a bug or by hand): the engine
    counts the approvals of the plan it would run and asks for them instead of running."""
    fakes.reset()
    bot = make_bot({"demo": runbook([record("a", "a")], risk="medium")},
                   engine={"poll_seconds": 0.05})  # a loop that never ends fails in seconds
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    with bot.db.begin() as conn:
        conn.execute(update(executions_table).where(executions_table.c.id == execution_id)
                     .values(state="approved"))
    engine = Engine(bot, sleep=lambda s: None)
    try:
        run_pending_once(engine)
    finally:
        engine.close()
    assert bot.get(execution_id).state == "awaiting_approval"
    assert fakes.JOURNAL == []  # no step ran
    with bot.db.connect() as conn:
        missing = [e for e in audit.events(conn, execution_id=execution_id)
                   if e["kind"] == "approval_missing"]
    assert missing and missing[0]["data"]["what"] == "0 of 1 approvals"


def test_a_run_that_loses_its_locks_while_running_is_held_before_its_next_step(
        make_bot: BotFactory) -> None:
    fakes.reset()
    bot = make_bot({"demo": runbook([
        {"id": "wait", "action": "test.gate", "with": {"key": "wait", "seconds": 30}},
        record("b", "b")])})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")  # risk low: runs at once
    engine = Engine(bot, sleep=lambda s: None)
    box: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: box.update(ex=drive(engine, execution_id)),
                              daemon=True)
    worker.start()
    try:
        assert fakes.STARTED.setdefault("wait", threading.Event()).wait(10)
        with bot.db.begin() as conn:  # expired and taken by another run meanwhile
            conn.execute(locks.delete().where(locks.c.execution_id == execution_id))
        fakes.GATES.setdefault("wait", threading.Event()).set()
        worker.join(20)
    finally:
        engine.close()
    assert not worker.is_alive()
    assert box["ex"].state == "held", box["ex"].error
    token = box["ex"].fencing_token
    assert box["ex"].error == (
        f"execution {execution_id} no longer holds its locks (fencing token {token}): another "
        f"execution may be working on its nodes. Check them, then `runbook cancel "
        f"{execution_id}`")
    assert ("test.record", "b") not in fakes.JOURNAL  # the next step never ran


def test_finish_never_overwrites_an_ended_execution(make_bot: BotFactory) -> None:
    bot = make_bot({"demo": runbook([record("a", "a")], risk="medium")})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    assert bot.cancel(execution_id, "alice").state == "cancelled"
    with bot.db.begin() as conn:
        ex = executions.get(conn, execution_id)
        assert not executions.finish(conn, ex, State.SUCCEEDED, "engine")  # default guard
        assert not executions.finish(conn, ex, State.FAILED, "engine", "late",
                                     expect={"state": {State.RUNNING, State.UNDOING}})
        assert executions.update_if(conn, execution_id, {"state": {State.CANCELLED}},
                                    error="a set of expected states is honoured")
    ex = bot.get(execution_id)
    assert ex.state == "cancelled" and ex.error == "a set of expected states is honoured"

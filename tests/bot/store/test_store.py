"""The whole request -> approval -> run -> audit path on each database the bot supports
(SQLite and PostgreSQL), and locks under concurrent requests."""

from __future__ import annotations

import threading

import pytest

from bot.execution.engine import Engine
from bot.store import audit
from kit.errors import Refused
from tests.bot import fakes
from tests.bot.execution.test_engine import record, runbook
from tests.conftest import BotFactory


@pytest.fixture(autouse=True)
def _clean() -> None:
    fakes.reset()


def test_full_path(make_bot: BotFactory, db_url: str) -> None:
    bot = make_bot({"demo": runbook([record("a", "a"), record("b", "b")], risk="high")},
                   url=db_url)
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    bot.approve(execution_id, "carol")
    bot.approve(execution_id, "dave")
    engine = Engine(bot, sleep=lambda s: None)
    ex = engine.drive(execution_id)
    engine.close()
    assert ex.state == "succeeded"
    assert ex.version == "1.0.0" and len(ex.content_hash) == 64
    assert audit.verify(bot.db).ok
    with bot.db.connect() as conn:
        kinds = [e["kind"] for e in audit.events(conn, execution_id=execution_id)]
    assert kinds == ["requested", "planned", "approved", "approved", "started", "step_started",
                     "step_finished", "step_started", "step_finished", "finished"]


def test_concurrent_requests_for_one_lock(make_bot: BotFactory, db_url: str) -> None:
    bot = make_bot({"demo": runbook([record("a", "a")], risk="medium")}, url=db_url)
    bot.runbooks()
    outcomes: list[str] = []
    barrier = threading.Barrier(4)

    def ask(user: str) -> None:
        barrier.wait()
        try:
            bot.request("demo", {"node": "gpu03"}, user)
            outcomes.append("granted")
        except Refused as exc:
            outcomes.append("refused" if "is held by execution" in str(exc) else str(exc))

    threads = [threading.Thread(target=ask, args=(u,)) for u in ("alice", "bob", "carol", "dave")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes) == ["granted", "refused", "refused", "refused"]
    assert audit.verify(bot.db).ok

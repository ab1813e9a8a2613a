"""The engine at two edges: a claim silent for exactly the stale share of a lease is still
kept (by a clock the test sets), and a held run resumed on request no longer shows why it
was held while it runs again."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from bot.execution import claims as claims_module
from bot.execution import executions
from bot.execution.claims import STALE_SHARE, Claim
from bot.execution.engine import Engine
from bot.service import Service
from tests.bot import fakes
from tests.bot.execution.bounded import drive
from tests.bot.execution.test_engine import record, runbook
from tests.conftest import BotFactory


@pytest.fixture(autouse=True)
def _clean() -> None:
    fakes.reset()


def test_a_claim_silent_for_exactly_the_stale_share_is_kept_and_a_moment_more_is_not(
        make_bot: BotFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = {"now": 0.0}
    monkeypatch.setattr(claims_module, "time", SimpleNamespace(
        time=time.time, monotonic=lambda: clock["now"], sleep=time.sleep))
    bot = make_bot({"demo": runbook([record("a", "a")])}, engine={"lease_seconds": 10.0})
    engine = Engine(bot)
    claim = Claim(1, 1, None, None, renewed=0.0)
    try:
        clock["now"] = 10.0 * STALE_SHARE  # exactly the share: 6 s of a 10 s lease
        engine.claims.check_stale(claim, "database is locked")
        assert not claim.lost.is_set() and claim.reason == ""
        clock["now"] = 10.0 * STALE_SHARE + 0.001
        engine.claims.check_stale(claim, "database is locked")
        assert claim.lost.is_set()
        assert claim.reason == "could not renew its lease for 6s (database is locked)"
    finally:
        engine.close()


class ErrorWhenResumed:
    """A reporter that reads the execution's error as the engine says it resumed it (the
    write is committed by then)."""

    def __init__(self, bot: Service) -> None:
        self.bot = bot
        self.errors: list[str | None] = []

    def __call__(self, execution_id: int, line: str) -> None:
        if line.startswith("resumed at stage"):
            self.errors.append(self.bot.get(execution_id).error)


def test_a_held_run_resumed_on_request_no_longer_shows_why_it_was_held(
        make_bot: BotFactory) -> None:
    bot = make_bot({"demo": runbook([record("a", "a", idempotent=False), record("b", "b")])})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    dead = Engine(bot, owner="dead-engine")
    claim = dead.claims.take(execution_id)
    assert claim is not None
    dead._start(claim, dead._load(execution_id))
    with bot.db.begin() as conn:  # a was under way when the process vanished
        executions.save_step(conn, execution_id, "do", "a", 0, state="running", attempt=1)
        executions.set_fields(conn, execution_id, stage="steps", lease_until=time.time() - 1)
    dead.close()
    heard = ErrorWhenResumed(bot)
    survivor = Engine(bot, report=heard, sleep=lambda s: None)
    try:
        held = drive(survivor, execution_id)
        assert held.state == "held" and "not idempotent" in (held.error or "")
        bot.resume(execution_id, "alice")
        assert bot.get(execution_id).error == held.error  # kept until the engine resumes it
        resumed = drive(survivor, execution_id)
    finally:
        survivor.close()
    assert heard.errors == [None]  # running again: the reason it was held is gone
    assert resumed.state == "succeeded" and resumed.error is None
    assert fakes.JOURNAL == [("test.record", "a"), ("test.record", "b")]

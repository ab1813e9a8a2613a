"""Execution rows as bot.execution.executions writes and reads them: a request stored as it
was planned, found by its nodes and filters, failed checks and decisions counted for their
own execution and plan, step states kept, and an approval window that runs out.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import pytest
import time_machine
from sqlalchemy import Engine

from bot.execution import executions
from bot.execution.planning import Plan
from bot.service import Service
from bot.store import audit
from bot.store.schema import approvals
from bot.store.words import State
from tests.bot.execution.test_engine import record, runbook
from tests.conftest import BotFactory


def _bot(make_bot: BotFactory, risk: str = "medium") -> Service:
    return make_bot({"demo": runbook([record("a", "a")], risk=risk)})


def _create(db: Engine, plan: Plan, user: str = "alice", **kwargs: Any) -> int:
    with db.begin() as conn:
        return executions.create(conn, plan, user, kwargs.pop("resume", "auto"),
                                 kwargs.pop("deadline", None), **kwargs)


def test_a_request_is_stored_as_it_was_planned(make_bot: BotFactory) -> None:
    bot = _bot(make_bot)
    plan = bot.plan("demo", {"node": "gpu02"})
    before = time.time()
    execution_id = _create(bot.db, plan, resume="manual", deadline=123.5,
                           source="a-source-longer-than-sixteen")
    with bot.db.connect() as conn:  # as stored (bot.get would expire it: its deadline passed)
        ex = executions.get(conn, execution_id)
    assert (ex.runbook, ex.version, ex.content_hash, ex.params, ex.requested_by) == (
        "demo", "1.0.0", plan.content_hash, {"node": "gpu02"}, "alice")
    assert ex.state is State.AWAITING_APPROVAL and ex.stage == "approval"
    assert (ex.plan, ex.plan_hash, ex.approvals_required, ex.approval_deadline) == (
        plan, plan.hash, 1, 123.5)
    assert (ex.resume, ex.cancel_requested, ex.resume_requested, ex.fencing_token) == (
        "manual", False, False, 0)
    assert (ex.source, ex.break_glass, ex.checks_failed, ex.owner) == (
        "a-source-longer-", False, 0, None)
    assert datetime.fromisoformat(ex.requested_at).timestamp() >= before - 1
    assert bot.get(_create(bot.db, plan)).source == "cli"  # who asked, when nobody says


def test_a_plan_needing_no_approval_is_approved_at_once(make_bot: BotFactory) -> None:
    bot = _bot(make_bot, risk="low")
    plan = bot.plan("demo", {"node": "gpu01"})
    assert plan.approval.required == 0
    assert bot.get(_create(bot.db, plan)).state is State.APPROVED


def test_executions_are_found_by_the_nodes_they_lock_and_by_filters(
        make_bot: BotFactory) -> None:
    bot = _bot(make_bot)
    first = _create(bot.db, bot.plan("demo", {"node": "gpu02"}), "alice")
    second = _create(bot.db, bot.plan("demo", {"node": "gpu03"}), "bob")
    with bot.db.begin() as conn:
        executions.set_fields(conn, second, state=State.RUNNING)

        def ids(**kwargs: Any) -> list[int]:
            return [ex.id for ex in executions.find(conn, **kwargs)]

        assert ids() == [second, first]  # newest first
        assert ids(node="gpu02") == [first] and ids(node="gpu01") == []
        assert ids(states=frozenset({"running"})) == [second]
        assert ids(user="alice") == [first] and ids(runbook="other") == []
        assert ids(runbook="demo", limit=1) == [second]


def test_failed_checks_are_counted_on_their_own_execution(make_bot: BotFactory) -> None:
    bot = _bot(make_bot)
    first = _create(bot.db, bot.plan("demo", {"node": "gpu02"}))
    second = _create(bot.db, bot.plan("demo", {"node": "gpu03"}))
    with bot.db.begin() as conn:
        executions.count_failed_check(conn, first)
        executions.count_failed_check(conn, first)
    assert (bot.get(first).checks_failed, bot.get(second).checks_failed) == (2, 0)


def test_only_approvals_of_that_execution_and_plan_count_in_the_order_given(
        make_bot: BotFactory) -> None:
    bot = _bot(make_bot)
    first = _create(bot.db, bot.plan("demo", {"node": "gpu02"}))
    second = _create(bot.db, bot.plan("demo", {"node": "gpu03"}))
    with bot.db.begin() as conn:
        for execution_id, user, decision, plan_hash in [
                (first, "dave", "approve", "h1"), (first, "bob", "deny", "h1"),
                (first, "carol", "approve", "h1"), (first, "erin", "approve", "h2"),
                (second, "frank", "approve", "h1")]:
            executions.record_decision(conn, execution_id, user, decision, plan_hash, None)
        assert executions.approvals_for(conn, first, "h1") == ["dave", "carol"]
        assert executions.approvals_for(conn, second, "h1") == ["frank"]


def test_a_compare_and_set_writes_only_while_the_row_is_as_expected(
        make_bot: BotFactory) -> None:
    bot = _bot(make_bot)
    execution_id = _create(bot.db, bot.plan("demo", {"node": "gpu02"}))
    with bot.db.begin() as conn:
        assert not executions.update_if(conn, execution_id, {"state": "running"}, stage="x")
        assert executions.update_if(conn, execution_id,
                                    {"state": {"approved", "awaiting_approval"}}, stage="y")
    ex = bot.get(execution_id)
    assert (ex.stage, ex.row_version) == ("y", 1)


def test_step_states_are_saved_updated_and_read_back(make_bot: BotFactory) -> None:
    bot = _bot(make_bot)
    execution_id = _create(bot.db, bot.plan("demo", {"node": "gpu02"}))
    with bot.db.begin() as conn:
        executions.save_step(conn, execution_id, "steps", "a", 0, state="running")
        executions.save_step(conn, execution_id, "steps", "a", 0, state="done", attempt=2,
                             result={"changed": True})
        executions.save_step(conn, execution_id, "undo", "a", 3, state="running", result=None)
        states = executions.step_states_of(conn, execution_id)
    done, undo = states[("steps", "a")], states[("undo", "a")]
    assert (done.state, done.attempt, done.position, done.result) == ("done", 2, 0,
                                                                      {"changed": True})
    assert (undo.state, undo.attempt, undo.position, undo.result) == ("running", 0, 3, None)


def test_an_approval_window_runs_out_at_its_deadline_not_before(make_bot: BotFactory) -> None:
    bot = _bot(make_bot)
    now = 2_000_000_000.0
    waiting = _create(bot.db, bot.plan("demo", {"node": "gpu02"}), deadline=now)
    later = _create(bot.db, bot.plan("demo", {"node": "gpu03"}), deadline=now + 1)
    with time_machine.travel(now, tick=False), bot.db.begin() as conn:
        assert not executions.expire_if_due(conn, executions.get(conn, later))
        assert executions.expire_if_due(conn, executions.get(conn, waiting))
        assert not executions.expire_if_due(conn, executions.get(conn, waiting))  # ended
    ex = bot.get(waiting)
    assert (ex.state, ex.error) == (State.EXPIRED, "no approval before the deadline")
    assert bot.get(later).state is State.AWAITING_APPROVAL
    with bot.db.connect() as conn:
        kinds = [(e["kind"], e["actor"], e["data"].get("deadline"))
                 for e in audit.events(conn, execution_id=waiting)]
    assert kinds == [("expired", "bot", now), ("finished", "bot", None)]


def test_no_deadline_or_an_approved_request_never_expires(make_bot: BotFactory) -> None:
    bot = _bot(make_bot)
    open_ended = _create(bot.db, bot.plan("demo", {"node": "gpu02"}))
    approved = _create(bot.db, bot.plan("demo", {"node": "gpu03"}), deadline=1.0)
    with bot.db.begin() as conn:
        executions.set_fields(conn, approved, state=State.APPROVED)
        assert not executions.expire_if_due(conn, executions.get(conn, open_ended))
        assert not executions.expire_if_due(conn, executions.get(conn, approved))
    assert bot.get(approved).state is State.APPROVED


def _kinds(bot: Service, execution_id: int) -> list[tuple[str, str, dict[str, Any]]]:
    with bot.db.connect() as conn:
        return [(e["kind"], e["actor"], e["data"])
                for e in audit.events(conn, execution_id=execution_id)]


def test_an_ending_clears_the_claim_frees_the_locks_and_proposes_the_follow_up(
        make_bot: BotFactory) -> None:
    bot = make_bot({"demo": runbook([record("a", "a")], risk="medium",
                                    propose_on_failure={"runbook": "demo",
                                                        "params": {"node": "{{ node }}"}})})
    failed, cancelled = (bot.request("demo", {"node": node}, "alice")
                         for node in ("gpu02", "gpu03"))
    with bot.db.begin() as conn:
        for execution_id in (failed, cancelled):
            executions.set_fields(conn, execution_id, owner="engine-1", lease_until=5.0)
        assert executions.finish(conn, executions.get(conn, failed), State.FAILED, "engine",
                                 "boom", why="test")
        assert executions.finish(conn, executions.get(conn, cancelled), State.CANCELLED,
                                 "alice")
        assert not executions.finish(conn, executions.get(conn, failed), State.CANCELLED,
                                     "alice")  # ended already: nothing written
    ex = bot.get(failed)
    assert (ex.state, ex.error, ex.owner, ex.lease_until) == (State.FAILED, "boom", None, None)
    assert ex.finished_at is not None
    ended = [(actor, data) for kind, actor, data in _kinds(bot, failed) if kind == "finished"]
    assert ended == [("engine", {"state": "failed", "error": "boom",
                                 "locks_released": ["node:gpu02"], "why": "test"})]
    proposed = [data for kind, _, data in _kinds(bot, failed) if kind == "proposed"]
    assert [(p["runbook"], p["after_execution"], p["reason"]) for p in proposed] == [
        ("demo", failed, f"demo (execution {failed}) failed: boom")]
    assert "proposed" not in [kind for kind, _, _ in _kinds(bot, cancelled)]
    assert bot.request("demo", {"node": "gpu02"}, "bob")  # its node is free again


def test_a_decision_keeps_its_reason_and_a_missing_execution_is_named(
        make_bot: BotFactory) -> None:
    bot = _bot(make_bot)
    execution_id = _create(bot.db, bot.plan("demo", {"node": "gpu02"}))
    with bot.db.begin() as conn:
        executions.record_decision(conn, execution_id, "bob", "deny", "h", "wrong node")
        reason = conn.execute(approvals.select()).one().reason
        with pytest.raises(executions.NotFound) as missing:
            executions.get(conn, 999)
    assert reason == "wrong node"
    assert str(missing.value) == "there is no execution 999"


def test_an_ending_that_expects_another_state_writes_nothing(make_bot: BotFactory) -> None:
    """``finish`` with ``expect``: a request still waiting for approval is not ended by a
    caller that expected it running (the default guard, not ended, would let it)."""
    bot = _bot(make_bot)
    execution_id = _create(bot.db, bot.plan("demo", {"node": "gpu01"}))
    ex = bot.get(execution_id)
    with bot.db.begin() as conn:
        assert not executions.finish(conn, ex, State.FAILED, "bot", "late",
                                     expect={"state": State.RUNNING})
    assert bot.get(execution_id).state is State.AWAITING_APPROVAL
    with bot.db.begin() as conn:
        assert executions.finish(conn, ex, State.CANCELLED, "alice", "no",
                                 expect={"state": State.AWAITING_APPROVAL})
    assert bot.get(execution_id).state is State.CANCELLED


def test_a_break_glass_request_is_stored_as_one(make_bot: BotFactory) -> None:
    from dataclasses import replace

    bot = _bot(make_bot)
    plan = replace(bot.plan("demo", {"node": "gpu01"}), break_glass=True)
    assert bot.get(_create(bot.db, plan)).break_glass is True


def test_a_listing_holds_the_newest_200_unless_told(make_bot: BotFactory) -> None:
    bot = _bot(make_bot)
    plan = bot.plan("demo", {"node": "gpu01"})
    with bot.db.begin() as conn:
        made = [executions.create(conn, plan, "alice", "auto", None) for _ in range(201)]
        listed = executions.find(conn)
        assert [ex.id for ex in listed] == made[::-1][:200]
        assert len(executions.find(conn, limit=201)) == 201

"""The engine: stages in order, undo in reverse, retries, timeouts, cancel, skipped steps,
approval voided when the plan changes, and resume after a takeover without repeating steps."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from bot.execution import executions
from bot.execution.engine import Engine
from bot.runbooks.catalogue import Catalogue
from bot.service import Service
from bot.store import audit
from tests.bot import fakes
from tests.conftest import BotFactory, standard_actions


@pytest.fixture(autouse=True)
def _clean() -> None:
    fakes.reset()


def runbook(steps: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "demo",
        "version": "1.0.0",
        "summary": "engine test",
        "risk": "low",
        "params": {"node": {"type": "node", "required": True}},
        "locks": ["node:{{ node }}"],
        "steps": steps,
    }
    body.update(extra)
    return body


def record(step_id: str, key: str, undo: bool = True, **extra: Any) -> dict[str, Any]:
    step: dict[str, Any] = {"id": step_id, "action": "test.record", "with": {"key": key}}
    if undo:
        step["undo"] = {"action": "test.forget", "with": {"key": key}}
    step.update(extra)
    return step


def run(bot: Service, params: dict[str, str] | None = None, user: str = "alice") -> Any:
    execution_id = bot.request("demo", params or {"node": "gpu01"}, user)
    engine = Engine(bot, sleep=lambda s: None)
    try:
        return engine.drive(execution_id)
    finally:
        engine.close()


def test_steps_run_in_order_and_succeed(make_bot: BotFactory) -> None:
    bot = make_bot({"demo": runbook([record("a", "{{ node }}-a"), record("b", "{{ node }}-b")])})
    ex = run(bot)
    assert ex.state == "succeeded"
    assert fakes.JOURNAL == [("test.record", "gpu01-a"), ("test.record", "gpu01-b")]


def test_failure_undoes_completed_steps_in_reverse(make_bot: BotFactory) -> None:
    fakes.FAILURES["c"] = 99
    steps = [record("a", "a"), record("b", "b"),
             {"id": "c", "action": "test.flaky", "with": {"key": "c"}}]
    ex = run(make_bot({"demo": runbook(steps)}))
    assert ex.state == "failed"
    assert "step c failed" in (ex.error or "")
    assert fakes.JOURNAL[-2:] == [("test.forget", "b"), ("test.forget", "a")]
    assert fakes.STATE == {"a": False, "b": False}


def test_on_failure_leave_keeps_completed_steps(make_bot: BotFactory) -> None:
    fakes.FAILURES["c"] = 99
    steps = [record("a", "a"), {"id": "c", "action": "test.flaky", "with": {"key": "c"}}]
    ex = run(make_bot({"demo": runbook(steps, on_failure="leave")}))
    assert ex.state == "failed"
    assert ("test.forget", "a") not in fakes.JOURNAL
    assert "left as they are" in (ex.error or "")


def test_retries_until_success(make_bot: BotFactory) -> None:
    fakes.FAILURES["f"] = 2
    steps = [{"id": "f", "action": "test.flaky", "with": {"key": "f"}, "retries": 2,
              "retry_delay": "0s"}]
    ex = run(make_bot({"demo": runbook(steps)}))
    assert ex.state == "succeeded"
    assert fakes.JOURNAL.count(("test.flaky", "f")) == 3


def test_retries_exhausted_fails(make_bot: BotFactory) -> None:
    fakes.FAILURES["f"] = 5
    steps = [{"id": "f", "action": "test.flaky", "with": {"key": "f"}, "retries": 1}]
    ex = run(make_bot({"demo": runbook(steps)}))
    assert ex.state == "failed"
    assert fakes.JOURNAL.count(("test.flaky", "f")) == 2


def test_step_timeout_fails_the_step(make_bot: BotFactory) -> None:
    steps = [record("a", "a"),
             {"id": "slow", "action": "test.gate", "with": {"key": "g", "seconds": 5},
              "timeout": "200ms"}]
    started = time.monotonic()
    ex = run(make_bot({"demo": runbook(steps)}))
    assert ex.state == "failed"
    assert "timed out" in (ex.error or "")
    assert time.monotonic() - started < 4
    assert fakes.STATE["a"] is False  # undone


def test_when_false_skips_step(make_bot: BotFactory) -> None:
    steps = [record("slurm", "s", when="{{ node in slurm }}"),
             record("k8s", "k", when="{{ node in kubernetes }}")]
    bot = make_bot({"demo": runbook(steps)})
    ex = run(bot, {"node": "gpu01"})
    assert ex.state == "succeeded"
    assert fakes.JOURNAL == [("test.record", "s")]
    with bot.db.connect() as conn:
        states = executions.step_states_of(conn, ex.id)
    assert states[("do", "k8s")].state == "skipped"


def test_pre_check_failure_runs_nothing(make_bot: BotFactory) -> None:
    checks = [{"name": "always fails", "command": "false-cmd", "expect": "== 0"}]
    bot = make_bot({"demo": runbook([record("a", "a")], pre_checks=checks)},
                   host_commands={"false-cmd": {"argv": ["false"]}})
    ex = run(bot)
    assert ex.state == "failed"
    assert "nothing was run" in (ex.error or "")
    assert fakes.JOURNAL == []


def test_post_check_failure_undoes(make_bot: BotFactory) -> None:
    checks = [{"name": "always fails", "command": "false-cmd", "expect": "== 0"}]
    bot = make_bot({"demo": runbook([record("a", "a")], post_checks=checks)},
                   host_commands={"false-cmd": {"argv": ["false"]}})
    ex = run(bot)
    assert ex.state == "failed"
    assert fakes.JOURNAL == [("test.record", "a"), ("test.forget", "a")]


def test_unconfigured_check_kind_fails_closed(make_bot: BotFactory) -> None:
    checks = [{"name": "gpu idle", "promql": "max(DCGM_FI_DEV_GPU_UTIL)", "expect": "< 5"}]
    ex = run(make_bot({"demo": runbook([record("a", "a")], pre_checks=checks)}))
    assert ex.state == "failed"
    assert "not available" in (ex.error or "")


def test_cancel_stops_at_next_boundary_and_undoes(make_bot: BotFactory) -> None:
    steps = [record("a", "a"), {"id": "wait", "action": "test.gate", "with": {"key": "g"}},
             record("b", "b")]
    bot = make_bot({"demo": runbook(steps)})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    engine = Engine(bot, sleep=lambda s: None)
    result: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: result.update(ex=engine.drive(execution_id)))
    worker.start()
    assert fakes.STARTED.setdefault("g", threading.Event()).wait(10)
    assert bot.cancel(execution_id, "alice").state == "running"
    fakes.GATES["g"].set()
    worker.join(10)
    engine.close()
    ex = result["ex"]
    assert ex.state == "cancelled"
    assert ("test.record", "b") not in fakes.JOURNAL
    assert fakes.JOURNAL[-1] == ("test.forget", "a")
    assert fakes.STATE["a"] is False


def test_approval_voided_when_plan_changes(make_bot: BotFactory) -> None:
    steps = [{"id": "run", "action": "host.run", "with": {"command": "probe"}}]
    body = runbook(steps, risk="medium")
    bot = make_bot({"demo": body}, host_commands={"probe": {"argv": ["true"]}})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    bot.approve(execution_id, "carol")
    # The site changes what "probe" runs: the approved plan no longer describes the run.
    bot.config.host_commands["probe"] = bot.config.host_commands["probe"].model_copy(
        update={"argv": ["true", "--changed"]})
    bot.catalogue = Catalogue([*fakes.test_actions(), *standard_actions(bot.config, bot.db)])
    engine = Engine(bot, sleep=lambda s: None)
    ex = engine.drive(execution_id, wait_for_approval=False)
    engine.close()
    assert ex.state == "awaiting_approval"
    assert bot.approvals(execution_id) == []  # the approval was for the old plan hash
    with bot.db.connect() as conn:
        kinds = [e["kind"] for e in audit.events(conn, execution_id=execution_id)]
    assert "approval_voided" in kinds


def test_resume_skips_finished_steps(make_bot: BotFactory) -> None:
    """An engine died after step a finished and while b was running: b runs again, a does not."""
    bot = make_bot({"demo": runbook([record("a", "a"), record("b", "b"), record("c", "c")])})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    dead = Engine(bot, owner="dead-engine")
    claim = dead._claim(execution_id)
    assert claim is not None
    dead._start(claim, dead._load(execution_id))
    ex = dead._load(execution_id)
    dead._stage(claim, ex, "steps")
    step_a = ex.plan.steps[0]
    dead._call(claim, ex, step_a, _call(step_a), "do", 0, 0)
    with bot.db.begin() as conn:  # b "started" and then the process vanished
        executions.save_step(conn, ex.id, "do", "b", 1, state="running", attempt=1)
        executions.set_fields(conn, ex.id, lease_until=time.time() - 1)
    dead.close()
    fakes.JOURNAL.clear()

    survivor = Engine(bot, sleep=lambda s: None)
    final = survivor.drive(execution_id)
    survivor.close()
    assert final.state == "succeeded"
    assert fakes.JOURNAL == [("test.record", "b"), ("test.record", "c")]


def test_manual_resume_holds_for_a_person(make_bot: BotFactory) -> None:
    bot = make_bot({"demo": runbook([record("a", "a"), record("b", "b")], resume="manual")})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    dead = Engine(bot, owner="dead-engine")
    claim = dead._claim(execution_id)
    assert claim is not None
    dead._start(claim, dead._load(execution_id))
    with bot.db.begin() as conn:
        executions.set_fields(conn, execution_id, stage="steps", lease_until=time.time() - 1)
    dead.close()
    survivor = Engine(bot, sleep=lambda s: None)
    assert survivor.drive(execution_id).state == "held"
    assert fakes.JOURNAL == []
    bot.resume(execution_id, "alice")
    assert survivor.drive(execution_id).state == "succeeded"
    survivor.close()


def test_live_lease_is_not_taken_over(make_bot: BotFactory) -> None:
    bot = make_bot({"demo": runbook([record("a", "a")])})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    holder = Engine(bot, owner="holder")
    assert holder.claim(execution_id)[0]
    other = Engine(bot, owner="other")
    assert other.claim(execution_id)[0] is False
    holder.close()
    other.close()


def _call(step: Any) -> Any:
    from bot.execution.planning import PlannedCall

    return PlannedCall(step.action, step.args, step.operations)


@pytest.mark.parametrize("yes", [True, False])
def test_confirm_waits_for_a_person(make_bot: BotFactory, yes: bool) -> None:
    steps = [record("a", "a"),
             {"id": "swap", "action": "chat.confirm",
              "with": {"question": "GPU replaced on {{ node }}?", "poll": 0.05}},
             record("b", "b")]
    bot = make_bot({"demo": runbook(steps)})
    execution_id = bot.request("demo", {"node": "gpu02"}, "alice")
    engine = Engine(bot, sleep=lambda s: None)
    result: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: result.update(ex=engine.drive(execution_id)))
    worker.start()
    deadline = time.monotonic() + 10
    while "confirmation_requested" not in _kinds(bot, execution_id):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    with pytest.raises(Exception, match="may not answer"):
        bot.confirm(execution_id, "bob", True, None)
    assert bot.confirm(execution_id, "alice", yes, "swapped by DC tech") == "GPU replaced on gpu02?"
    worker.join(10)
    engine.close()
    if yes:
        assert result["ex"].state == "succeeded"
        assert fakes.JOURNAL[-1] == ("test.record", "b")
    else:
        assert result["ex"].state == "failed"
        assert "alice answered no" in (result["ex"].error or "")
        assert fakes.JOURNAL[-1] == ("test.forget", "a")


def _kinds(bot: Service, execution_id: int) -> list[str]:
    with bot.db.connect() as conn:
        return [e["kind"] for e in audit.events(conn, execution_id=execution_id)]


def test_undo_skips_a_step_that_changed_nothing(make_bot: BotFactory) -> None:
    """Someone else had already done "a": failing later must not undo their work."""
    fakes.STATE["a"] = True
    fakes.FAILURES["c"] = 9
    steps = [record("a", "a"), record("b", "b"),
             {"id": "c", "action": "test.flaky", "with": {"key": "c"}}]
    bot = make_bot({"demo": runbook(steps)})
    ex = run(bot)
    assert ex.state == "failed"
    assert ("test.forget", "a") not in fakes.JOURNAL
    assert ("test.forget", "b") in fakes.JOURNAL
    assert fakes.STATE["a"] is True
    assert "undo_skipped" in _kinds(bot, ex.id)


def test_undo_if_failed_undoes_the_failing_step_too(make_bot: BotFactory) -> None:
    fakes.FAILURES["c"] = 9
    steps = [record("a", "a"),
             {"id": "c", "action": "test.flaky", "with": {"key": "c"}, "undo_if_failed": True,
              "undo": {"action": "test.forget", "with": {"key": "c"}}}]
    ex = run(make_bot({"demo": runbook(steps)}))
    assert ex.state == "failed"
    assert fakes.JOURNAL[-2:] == [("test.forget", "c"), ("test.forget", "a")]


def test_engine_loop_drives_executions_side_by_side(make_bot: BotFactory) -> None:
    steps = [{"id": "wait", "action": "test.gate", "with": {"key": "{{ node }}"}}]
    bot = make_bot({"demo": runbook(steps)})
    first = bot.request("demo", {"node": "gpu01"}, "alice")
    second = bot.request("demo", {"node": "gpu02"}, "bob")
    engine = Engine(bot)
    loop = threading.Thread(target=engine.run_pending, kwargs={"once": True})
    loop.start()
    for node in ("gpu01", "gpu02"):  # both wait at their gates at the same time
        assert fakes.STARTED.setdefault(node, threading.Event()).wait(10)
    for node in ("gpu01", "gpu02"):
        fakes.GATES[node].set()
    loop.join(20)
    engine.close()
    assert not loop.is_alive()
    assert bot.get(first).state == "succeeded" and bot.get(second).state == "succeeded"

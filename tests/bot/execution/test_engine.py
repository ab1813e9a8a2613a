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
from tests.bot.execution.bounded import drive, run_pending_once
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
        return drive(engine, execution_id)
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
    ex = run(make_bot({"demo": runbook(steps)}))
    assert ex.state == "failed"
    assert "timed out" in (ex.error or "")  # stopped by the step's timeout, not the gate's 5 s
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
    worker = threading.Thread(target=lambda: result.update(ex=drive(engine, execution_id)),
                              daemon=True)
    worker.start()
    assert fakes.STARTED.setdefault("g", threading.Event()).wait(10)
    assert bot.cancel(execution_id, "alice").state == "running"
    fakes.GATES["g"].set()
    worker.join(10)
    engine.close()
    assert not worker.is_alive()
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
    ex = drive(engine, execution_id, wait_for_approval=False)
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
    claim = dead.claims.take(execution_id)
    assert claim is not None
    dead._start(claim, dead._load(execution_id))
    ex = dead._load(execution_id)
    dead._stage(claim, ex, "steps")
    step_a = ex.plan.steps[0]
    dead.stepper.call(claim, ex, step_a, _call(step_a), "do", 0, 0)
    with bot.db.begin() as conn:  # b "started" and then the process vanished
        executions.save_step(conn, ex.id, "do", "b", 1, state="running", attempt=1)
        executions.set_fields(conn, ex.id, lease_until=time.time() - 1)
    dead.close()
    fakes.JOURNAL.clear()

    survivor = Engine(bot, sleep=lambda s: None)
    final = drive(survivor, execution_id)
    survivor.close()
    assert final.state == "succeeded"
    assert fakes.JOURNAL == [("test.record", "b"), ("test.record", "c")]


def test_manual_resume_holds_for_a_person(make_bot: BotFactory) -> None:
    bot = make_bot({"demo": runbook([record("a", "a"), record("b", "b")], resume="manual")})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    dead = Engine(bot, owner="dead-engine")
    claim = dead.claims.take(execution_id)
    assert claim is not None
    dead._start(claim, dead._load(execution_id))
    with bot.db.begin() as conn:
        executions.set_fields(conn, execution_id, stage="steps", lease_until=time.time() - 1)
    dead.close()
    survivor = Engine(bot, sleep=lambda s: None)
    held = drive(survivor, execution_id)
    assert (held.state, held.error) == ("held", (
        f"the engine driving it (dead-engine) stopped at stage steps; the runbook says resume: "
        f"manual: `runbook resume {execution_id}` or `runbook cancel {execution_id}`"))
    assert fakes.JOURNAL == []
    bot.resume(execution_id, "alice")
    assert drive(survivor, execution_id).state == "succeeded"
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
    worker = threading.Thread(target=lambda: result.update(ex=drive(engine, execution_id)),
                              daemon=True)
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
    assert not worker.is_alive()
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
    loop = threading.Thread(target=run_pending_once, args=(engine,), daemon=True)
    loop.start()
    for node in ("gpu01", "gpu02"):  # both wait at their gates at the same time
        assert fakes.STARTED.setdefault(node, threading.Event()).wait(10)
    for node in ("gpu01", "gpu02"):
        fakes.GATES[node].set()
    loop.join(20)
    engine.close()
    assert not loop.is_alive()
    assert bot.get(first).state == "succeeded" and bot.get(second).state == "succeeded"


# --- what the engine writes and says at start, on a new plan, on a takeover -----------------


class Said:
    """A reporter that keeps the engine's lines."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, str]] = []

    def __call__(self, execution_id: int, line: str) -> None:
        self.lines.append((execution_id, line))


def logged(bot: Service, execution_id: int, kind: str) -> list[tuple[str, dict[str, Any]]]:
    with bot.db.connect() as conn:
        return [(e["actor"], e["data"]) for e in audit.events(conn, execution_id=execution_id)
                if e["kind"] == kind]


def test_a_start_is_logged_with_its_plan_its_approvals_and_its_engine(
        make_bot: BotFactory) -> None:
    bot = make_bot({"demo": runbook([record("a", "a")], risk="medium")})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    bot.approve(execution_id, "carol")
    said = Said()
    engine = Engine(bot, owner="engine-1", report=said, sleep=lambda s: None)
    ex = drive(engine, execution_id)
    engine.close()
    assert ex.state == "succeeded"
    assert logged(bot, execution_id, "started") == [("engine", {
        "plan_hash": ex.plan_hash, "approved_by": ["carol"], "engine": "engine-1", "epoch": 1,
        "version": "1.0.0", "content_hash": ex.content_hash})]
    assert (execution_id, "started demo 1.0.0") in said.lines


def test_a_run_whose_locks_were_taken_before_it_started_fails_having_run_nothing(
        make_bot: BotFactory) -> None:
    from bot.execution import locking
    from bot.store.schema import locks

    bot = make_bot({"demo": runbook([record("a", "a")])})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")  # approved at once
    with bot.db.begin() as conn:  # its lock expired and another execution took it
        conn.execute(locks.update().values(expires_at=0.0))
        locking.acquire(conn, ["node:gpu01"], 999, "bob", 2e9, time.time())
    engine = Engine(bot, sleep=lambda s: None)
    ex = drive(engine, execution_id)
    engine.close()
    assert (ex.state, ex.error) == ("failed", "it lost its locks before it started (they "
                                    "expired and another execution took them); nothing was "
                                    "run: request it again")
    assert fakes.JOURNAL == []


def drive_with_plan(bot: Service, monkeypatch: pytest.MonkeyPatch, execution_id: int,
                    **changed: Any) -> tuple[Any, Any, Said]:
    """Drive with the plan made at start changed as given (the facts moved since the
    request); returns (the plan before, the execution after, what the engine said)."""
    from dataclasses import replace

    before = bot.get(execution_id).plan
    monkeypatch.setattr(bot, "replan", lambda ex: replace(ex.plan, **changed))
    said = Said()
    engine = Engine(bot, report=said, sleep=lambda s: None)
    ex = drive(engine, execution_id, wait_for_approval=False)
    engine.close()
    return before, ex, said


def test_a_plan_that_now_needs_other_locks_fails_having_run_nothing(
        make_bot: BotFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from bot.execution.engine import plan_changes

    bot = make_bot({"demo": runbook([record("a", "a")])})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    before, ex, _ = drive_with_plan(bot, monkeypatch, execution_id, hash="f" * 64,
                                    locks=["node:gpu01", "site"])
    assert (ex.state, ex.error) == ("failed", "the plan now needs other locks (node:gpu01, "
                                    "site); nothing was run: request it again")
    _, data = logged(bot, execution_id, "finished")[0]
    assert data["changes"] == plan_changes(before, replace(before, locks=["node:gpu01", "site"]))
    assert data["changes"] == ["locks: node:gpu01 -> node:gpu01, site"]
    assert fakes.JOURNAL == []


def test_a_new_plan_needing_no_approval_is_logged_and_run(
        make_bot: BotFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    bot = make_bot({"demo": runbook([record("a", "a")])})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    before, ex, _ = drive_with_plan(bot, monkeypatch, execution_id, hash="f" * 64,
                                    break_glass=True)
    assert ex.state == "succeeded" and ex.plan_hash == "f" * 64
    assert ex.plan.break_glass  # the plan it ran is stored with its hash
    assert logged(bot, execution_id, "replanned") == [("engine", {
        "old_plan_hash": before.hash, "new_plan_hash": "f" * 64,
        "changes": ["break_glass: False -> True"],
        "why": "the plan made at start differs; its policy needs no approval"})]


def test_a_new_plan_needing_approval_voids_the_old_one_and_asks_again(
        make_bot: BotFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    bot = make_bot({"demo": runbook([record("a", "a")], risk="medium")})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    bot.approve(execution_id, "carol")
    asked = time.time()
    before, ex, said = drive_with_plan(bot, monkeypatch, execution_id, hash="f" * 64,
                                       break_glass=True, outside_window=True)
    assert ex.state == "awaiting_approval" and ex.plan_hash == "f" * 64
    assert ex.approvals_required == 1 and ex.approval_deadline is not None
    expires = before.approval.expires_seconds
    assert asked + expires <= ex.approval_deadline <= time.time() + expires
    what = "break_glass: False -> True; outside_window: False -> True"
    assert not logged(bot, execution_id, "approval_missing")  # asked once, then it waits
    assert logged(bot, execution_id, "approval_voided") == [("engine", {
        "approved_plan_hash": before.hash, "new_plan_hash": "f" * 64, "required": 1,
        "what": what, "why": "the plan to run is not the approved one: approve the new plan"})]
    assert said.lines == [(execution_id, f"the plan changed since it was approved ({what}): "
                                         "asking for approval again")]
    assert fakes.JOURNAL == []


def test_a_takeover_is_logged_with_the_step_under_way(make_bot: BotFactory) -> None:
    bot = make_bot({"demo": runbook([record("a", "a"), record("b", "b")])})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    dead = Engine(bot, owner="dead-engine")
    claim = dead.claims.take(execution_id)
    assert claim is not None
    dead._start(claim, dead._load(execution_id))
    with bot.db.begin() as conn:  # a was running when the process vanished
        executions.save_step(conn, execution_id, "do", "a", 0, state="running", attempt=1)
        executions.set_fields(conn, execution_id, stage="steps", lease_until=time.time() - 1)
    dead.close()
    said = Said()
    survivor = Engine(bot, report=said, sleep=lambda s: None)
    assert drive(survivor, execution_id).state == "succeeded"
    survivor.close()
    assert logged(bot, execution_id, "resumed") == [("engine", {
        "stage": "steps", "previous_engine": "dead-engine", "step_under_way": "a"})]
    assert (execution_id, "resuming after engine dead-engine stopped (stage steps)") in (
        said.lines)


def test_a_step_under_way_that_is_not_idempotent_is_held_then_resumed_on_request(
        make_bot: BotFactory) -> None:
    bot = make_bot({"demo": runbook([record("a", "a", idempotent=False)])})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    dead = Engine(bot, owner="dead-engine")
    claim = dead.claims.take(execution_id)
    assert claim is not None
    dead._start(claim, dead._load(execution_id))
    with bot.db.begin() as conn:
        executions.save_step(conn, execution_id, "do", "a", 0, state="running", attempt=1)
        executions.set_fields(conn, execution_id, stage="steps", lease_until=time.time() - 1)
    dead.close()
    said = Said()
    survivor = Engine(bot, report=said, sleep=lambda s: None)
    held = drive(survivor, execution_id)
    why = (f"step a (test.record) was under way when the engine driving it (dead-engine) "
           f"stopped, and it is not idempotent: check what it did, then `runbook resume "
           f"{execution_id}` to run it again or `runbook cancel {execution_id}` to undo")
    assert (held.state, held.error) == ("held", why)
    assert logged(bot, execution_id, "held") == [("engine", {"why": why})]
    assert (execution_id, f"held for a person: {why}") in said.lines
    bot.resume(execution_id, "alice")
    resumed = drive(survivor, execution_id)
    survivor.close()
    assert resumed.state == "succeeded" and not resumed.resume_requested
    assert ("engine", {"stage": "steps", "by": "request"}) in logged(bot, execution_id,
                                                                     "resumed")
    assert (execution_id, "resumed at stage steps") in said.lines


def test_a_claim_not_renewed_for_most_of_a_lease_is_given_up_saying_why(
        make_bot: BotFactory) -> None:
    from bot.execution.claims import STALE_SHARE, Claim

    bot = make_bot({"demo": runbook([record("a", "a")])}, engine={"lease_seconds": 10.0})
    engine = Engine(bot)
    fresh = Claim(1, 1, None, None, renewed=time.monotonic() - 10.0 * STALE_SHARE + 1)
    engine.claims.check_stale(fresh, "database is locked")
    assert not fresh.lost.is_set()
    stale = Claim(1, 1, None, None, renewed=time.monotonic() - 10.0 * STALE_SHARE - 0.4)
    engine.claims.check_stale(stale, "x" * 300)
    assert stale.reason == f"could not renew its lease for 6s ({'x' * 200})"
    quiet = Claim(1, 1, None, None, renewed=time.monotonic() - 7.0)
    engine.claims.check_stale(quiet)
    assert quiet.reason == "could not renew its lease for 7s"
    engine.close()


def test_a_run_that_cannot_be_planned_again_fails_saying_why(
        make_bot: BotFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    from kit.errors import Refused

    bot = make_bot({"demo": runbook([record("a", "a")])})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")

    def refused(ex: Any) -> Any:
        raise Refused("demo 1.0.0 is no longer loaded")

    monkeypatch.setattr(bot, "replan", refused)
    ex = run_again(bot, execution_id)
    assert (ex.state, ex.error) == ("failed", "cannot plan again: demo 1.0.0 is no longer loaded")
    assert fakes.JOURNAL == []


def run_again(bot: Service, execution_id: int) -> Any:
    engine = Engine(bot, sleep=lambda s: None)
    try:
        return drive(engine, execution_id)
    finally:
        engine.close()


def test_the_boundary_between_steps_stops_holds_or_reports_a_cancel(
        make_bot: BotFactory) -> None:
    from bot.execution.claims import Stop
    from bot.execution.stepping import Hold
    from bot.store.schema import locks

    bot = make_bot({"demo": runbook([record("a", "a")])})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    engine = Engine(bot, sleep=lambda s: None)
    claim = engine.claims.take(execution_id)
    assert claim is not None
    ex = engine._load(execution_id)
    try:
        assert engine._boundary(claim, ex) is False
        with bot.db.begin() as conn:
            executions.set_fields(conn, execution_id, cancel_requested=True)
        assert engine._boundary(claim, ex) is True
        with bot.db.begin() as conn:
            conn.execute(locks.delete())
        assert engine._boundary(claim, ex, cancelling=True) is True  # undoing: goes on
        with pytest.raises(Hold, match=rf"^execution {execution_id} no longer holds"):
            engine._boundary(claim, ex)
        engine._handing_over.set()
        with pytest.raises(Stop) as handing:
            engine._boundary(claim, ex)
        assert str(handing.value) == (
            f"execution {execution_id}: this engine stopped (no longer the leader, or shutting "
            "down); another engine resumes it here")
        claim.lose("another engine claimed it")
        with pytest.raises(Stop) as lost:
            engine._boundary(claim, ex)
        assert str(lost.value) == f"execution {execution_id}: another engine claimed it"
    finally:
        engine.close()


def test_an_engine_that_lost_the_execution_holds_nothing_and_says_it_stopped(
        make_bot: BotFactory) -> None:
    bot = make_bot({"demo": runbook([record("a", "a")])})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    said = Said()
    engine = Engine(bot, report=said, sleep=lambda s: None)
    claim = engine.claims.take(execution_id)
    assert claim is not None
    claim.lose("another engine claimed it")
    engine._hold(claim, "a reason")
    engine.close()
    assert bot.get(execution_id).state == "approved" and not logged(bot, execution_id, "held")
    assert said.lines == [(execution_id, f"stopped driving: execution {execution_id}: "
                                         "another engine claimed it")]


def test_an_ending_at_start_writes_nothing_once_the_row_is_no_longer_approved(
        make_bot: BotFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each way _start ends a run (locks lost, no plan, other locks) expects it approved:
    a row that changed since the engine read it (asked again meanwhile) is left alone."""
    from dataclasses import replace

    from bot.store.schema import locks
    from bot.store.words import State
    from kit.errors import Refused

    bot = make_bot({"demo": runbook([record("a", "a")])})

    def no_plan(ex: Any) -> Any:
        raise Refused("no plan")

    for node, cause in (("gpu01", "locks"), ("gpu02", "no plan"), ("gpu03", "other locks")):
        execution_id = bot.request("demo", {"node": node}, "alice")  # approved at once
        engine = Engine(bot, sleep=lambda s: None)
        claim = engine.claims.take(execution_id)
        assert claim is not None
        stale = engine._load(execution_id)
        with bot.db.begin() as conn:
            executions.set_fields(conn, execution_id, state=State.AWAITING_APPROVAL)
            if cause == "locks":
                conn.execute(locks.delete().where(locks.c.execution_id == execution_id))
        if cause == "no plan":
            monkeypatch.setattr(bot, "replan", no_plan)
        if cause == "other locks":
            monkeypatch.setattr(bot, "replan", lambda ex: replace(
                ex.plan, hash="f" * 64, locks=[*ex.plan.locks, "site"]))
        engine._start(claim, stale)
        engine.close()
        assert bot.get(execution_id).state == "awaiting_approval", cause
        assert not logged(bot, execution_id, "finished"), cause


def test_a_takeover_with_no_step_under_way_does_not_wait_out_the_old_lease(
        make_bot: BotFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The clock the engine waits by is the test's: with no step under way nothing is run
    twice, so the new engine goes on at once (however long the old lease and the skew)."""
    from types import SimpleNamespace

    from bot.execution import engine as engine_module

    def wait(seconds: float) -> None:
        raise AssertionError(f"waited {seconds:.0f}s for the old lease")

    monkeypatch.setattr(engine_module, "time", SimpleNamespace(
        time=time.time, monotonic=time.monotonic, sleep=wait))
    bot = make_bot({"demo": runbook([record("a", "a"), record("b", "b")])},
                   engine={"clock_skew_seconds": 600})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    dead = Engine(bot, owner="dead-engine")
    claim = dead.claims.take(execution_id)
    assert claim is not None
    dead._start(claim, dead._load(execution_id))
    with bot.db.begin() as conn:  # stopped between two steps
        executions.set_fields(conn, execution_id, stage="steps", lease_until=time.time() - 1)
    dead.close()
    survivor = Engine(bot, sleep=lambda s: None)
    assert drive(survivor, execution_id).state == "succeeded"  # no wait: it would raise
    survivor.close()
    assert logged(bot, execution_id, "resumed") == [("engine", {
        "stage": "steps", "previous_engine": "dead-engine", "step_under_way": None})]

"""Calling a step (bot/execution/stepping.py): the wait before a retry (as long as the step
says, cut short by a cancel or a lost claim but not for an undo, then the check between
steps), the watcher's verdicts on a running step (a cancel, a lost claim, the timeout at its
deadline, the grace to stop) and what a step with a secret parameter returns, masked whole.
Waits are counted in the engine's fake sleeps, and the watcher reads a clock the test moves
(``clock``), so no verdict here depends on the machine's speed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from sqlalchemy import delete

from adapters.actions import ActionContext, ActionResult, ActionStopped, StrictArguments
from bot.execution import stepping
from bot.execution.engine import Engine
from bot.execution.executions import Execution
from bot.runbooks.catalogue import Catalogue
from bot.service import Service
from bot.store import audit
from bot.store.schema import locks
from tests.bot import fakes
from tests.bot.execution.bounded import DEADLINE, drive
from tests.bot.execution.test_engine import record, runbook
from tests.bot.test_secret_params import SECRET
from tests.bot.test_secret_params import make as make_keyed
from tests.conftest import BotFactory

Script = Callable[[Any, ActionContext], ActionResult]
SCRIPTS: dict[str, Script] = {}  # key -> what test.scripted does


@pytest.fixture(autouse=True)
def _clean() -> None:
    fakes.reset()
    SCRIPTS.clear()


class ScriptArguments(StrictArguments):
    key: str
    text: str = ""


class ScriptedAction:
    """Runs the test's script for its key: what a step does while the engine watches it."""

    name: ClassVar[str] = "test.scripted"
    Arguments: ClassVar[type[StrictArguments]] = ScriptArguments

    def plan(self, args: Any) -> list[str]:
        return [f"script {args.key}"]

    def run(self, args: Any, ctx: ActionContext) -> ActionResult:
        fakes.JOURNAL.append((self.name, args.key))
        return SCRIPTS[args.key](args, ctx)


def scripted(step_id: str, key: str, **extra: Any) -> dict[str, Any]:
    return {"id": step_id, "action": "test.scripted", "with": {"key": key}, **extra}


def with_scripts(bot: Service) -> Service:
    bot.catalogue = Catalogue([*bot.catalogue._actions.values(), ScriptedAction()])
    return bot


class Sleeps:
    """The engine's sleep: records each wait, does ``then`` at the first, and fails a wait
    that goes on past ``limit`` sleeps (one that would never end)."""

    def __init__(self, then: Callable[[], object] | None = None, limit: int = 200) -> None:
        self.waits: list[float] = []
        self.then, self.limit = then, limit

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        assert len(self.waits) <= self.limit, "the wait before a retry did not end"
        if len(self.waits) == 1 and self.then is not None:
            self.then()


class Clock:
    """The stepper's monotonic clock: it stands still until a test's action moves it, and
    counts the watcher's reads, so an action can wait until the watcher looked at a time."""

    def __init__(self, now: float = 100.0) -> None:
        self.now, self.reads = now, 0
        self._changed = threading.Condition()

    def monotonic(self) -> float:
        with self._changed:
            self.reads += 1
            self._changed.notify_all()
            return self.now

    def move_to(self, now: float, reads: int = 0) -> None:
        """Set the time; then wait until the watcher read it ``reads`` times."""
        with self._changed:
            self.now, start = now, self.reads
            assert self._changed.wait_for(lambda: self.reads >= start + reads, DEADLINE)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    moved = Clock()
    monkeypatch.setattr(stepping, "time", SimpleNamespace(monotonic=moved.monotonic))
    monkeypatch.setattr(stepping, "WATCH_SECONDS", 0.01)  # the watcher's turns, in real time
    return moved


def asked_to_stop(ctx: ActionContext, clock: Clock, reads: int = 20) -> bool:
    """Whether the watcher asks the action to stop before it read the clock ``reads`` times
    (each turn of it reads the clock). Once asked, waits until the watcher took the time it
    asked at (it reads the clock right after asking)."""
    start, until = clock.reads, time.monotonic() + DEADLINE
    while not ctx.stop.wait(0.005):
        if clock.reads - start >= reads or time.monotonic() > until:
            return False
    clock.move_to(clock.now, reads=2)
    return True


def engine_for(bot: Service, sleeps: Callable[[float], None] | None = None,
               lines: list[str] | None = None) -> Engine:
    def heard(execution_id: int, line: str) -> None:
        if lines is not None:
            lines.append(line)

    return Engine(bot, report=heard, sleep=sleeps or (lambda s: None))


def request(bot: Service) -> int:
    return bot.request("demo", {"node": "gpu01"}, "alice")


def run(engine: Engine, execution_id: int) -> Execution:
    try:
        return drive(engine, execution_id)
    finally:
        engine.close()


def undone_by(step: dict[str, Any], action: str, key: str) -> dict[str, Any]:
    return {**step, "undo": {"action": action, "with": {"key": key}}}


def step_events(bot: Service, execution_id: int, *kinds: str) -> list[dict[str, Any]]:
    with bot.db.connect() as conn:
        return [e["data"] for e in audit.events(conn, execution_id=execution_id)
                if e["kind"] in kinds]


def drop_locks(bot: Service, execution_id: int) -> None:
    """Another party took the execution's node locks (they expired unrenewed, say)."""
    with bot.db.begin() as conn:
        conn.execute(delete(locks).where(locks.c.execution_id == execution_id))


def cancel_itself(bot: Service) -> Script:
    """A step that asks to cancel its own execution and succeeds: the run is cancelled at
    the next boundary, with the cancel flag set while its undos run."""

    def script(args: Any, ctx: ActionContext) -> ActionResult:
        bot.cancel(ctx.execution_id, "alice")
        return ActionResult(summary="cancel asked")

    return script


# --- the wait before a retry -----------------------------------------------------------


def test_a_retry_waits_its_delay_looking_at_cancel_twice_a_second(
        make_bot: BotFactory) -> None:
    """Each failed attempt is recorded as retried, then the step waits its retry_delay in
    sleeps of at most WATCH_SECONDS; the third attempt succeeds. An attempt that returned at
    once is not watched on until its timeout (5 s) and grace (1 s) have passed."""
    fakes.FAILURES["f"] = 2
    bot = make_bot({"demo": runbook([{
        "id": "f", "action": "test.flaky", "with": {"key": "f"}, "retries": 2,
        "retry_delay": "2s", "timeout": "5s"}])}, engine={"stop_grace_seconds": 1.0})
    sleeps, lines = Sleeps(), list[str]()
    ex = run(engine_for(bot, sleeps, lines), request(bot))
    assert ex.state == "succeeded"
    assert fakes.JOURNAL == [("test.flaky", "f")] * 3
    assert all(0 < wait <= stepping.WATCH_SECONDS for wait in sleeps.waits)
    assert sum(sleeps.waits) == 4.0  # twice the delay, no more and no less
    failed = step_events(bot, ex.id, "step_failed", "step_finished")
    assert [(e["attempt"], e["state"], e.get("will_retry")) for e in failed] == [
        (1, "failed", True), (2, "failed", True), (3, "succeeded", None)]
    assert "step f: failed: f failed on purpose (retrying)" in lines


def test_a_cancel_cuts_the_wait_before_a_retry_short(make_bot: BotFactory) -> None:
    fakes.FAILURES["f"] = 99
    bot = make_bot({"demo": runbook([{
        "id": "f", "action": "test.flaky", "with": {"key": "f"}, "retries": 3,
        "retry_delay": "10s"}])})
    execution_id = request(bot)
    sleeps = Sleeps(then=lambda: bot.cancel(execution_id, "alice"))
    ex = run(engine_for(bot, sleeps), execution_id)
    assert sleeps.waits == [stepping.WATCH_SECONDS]  # the cancel was seen after one sleep
    assert fakes.JOURNAL == [("test.flaky", "f")]  # and no attempt started after it
    assert ex.state == "cancelled"


def test_a_lost_claim_cuts_the_wait_before_a_retry_short_and_stops_the_engine(
        make_bot: BotFactory) -> None:
    fakes.FAILURES["f"] = 99
    bot = make_bot({"demo": runbook([{
        "id": "f", "action": "test.flaky", "with": {"key": "f"}, "retries": 3,
        "retry_delay": "10s"}])})
    lines: list[str] = []
    holder: dict[str, Engine] = {}

    def lose() -> None:
        for claim in holder["engine"].claims.held():
            claim.lose("another engine took the lease (test)")

    sleeps = Sleeps(then=lose)
    engine = holder["engine"] = engine_for(bot, sleeps, lines)
    ex = run(engine, request(bot))
    assert sleeps.waits == [stepping.WATCH_SECONDS]
    assert fakes.JOURNAL == [("test.flaky", "f")]  # no attempt after the claim was lost
    assert f"stopped driving: execution {ex.id}: another engine took the lease (test)" in lines
    assert ex.state == "running"  # left for the engine that has it now


def test_an_engine_handing_over_starts_no_attempt_after_a_cancel_cut_its_wait(
        make_bot: BotFactory) -> None:
    """An engine shutting down (or no longer the leader) whose retry wait a cancel cut short
    runs the check between steps before anything else: it stops there, and the engine that
    takes the run over undoes it; it starts no further attempt itself."""
    fakes.FAILURES["f"] = 99
    bot = make_bot({"demo": runbook([{
        "id": "f", "action": "test.flaky", "with": {"key": "f"}, "retries": 3,
        "retry_delay": "10s"}])})
    lines: list[str] = []
    holder: dict[str, Engine] = {}
    execution_id = request(bot)

    def shut_down_and_cancel() -> None:
        holder["engine"]._handing_over.set()  # what run_pending does when told to stop
        bot.cancel(execution_id, "alice")

    sleeps = Sleeps(then=shut_down_and_cancel)
    engine = holder["engine"] = engine_for(bot, sleeps, lines)
    ex = run(engine, execution_id)
    assert sleeps.waits == [stepping.WATCH_SECONDS]
    assert fakes.JOURNAL == [("test.flaky", "f")]
    assert any(line.startswith("stopped driving:") and "another engine resumes it here" in line
               for line in lines)
    assert ex.state == "running" and ex.cancel_requested


def test_an_undo_waits_its_whole_delay_though_the_run_was_cancelled(
        make_bot: BotFactory) -> None:
    """A cancel ends the wait of a step, not of an undo: undoing is what the cancel asked."""
    fakes.FAILURES["u"] = 1
    steps = [undone_by(record("a", "a", retries=1, retry_delay="2s"), "test.flaky", "u"),
             scripted("b", "cancel")]
    bot = with_scripts(make_bot({"demo": runbook(steps)}))
    SCRIPTS["cancel"] = cancel_itself(bot)
    sleeps = Sleeps()
    ex = run(engine_for(bot, sleeps), request(bot))
    assert ex.state == "cancelled"
    assert sum(sleeps.waits) == 2.0
    assert fakes.JOURNAL.count(("test.flaky", "u")) == 2
    assert "undone: a" in (ex.error or "")


def test_an_undo_goes_on_after_its_locks_were_lost_in_the_wait_before_a_retry(
        make_bot: BotFactory) -> None:
    """Locks lost while an undo waits to retry: the undo goes on (it only gives back what
    this run did, and holding would leave it half undone)."""
    fakes.FAILURES.update(u=1, b=99)
    steps = [undone_by(record("a", "a", retries=1, retry_delay="1s"), "test.flaky", "u"),
             {"id": "b", "action": "test.flaky", "with": {"key": "b"}}]
    bot = make_bot({"demo": runbook(steps)})
    first = request(bot)
    ex = run(engine_for(bot, Sleeps(then=lambda: drop_locks(bot, first))), first)
    assert ex.state == "failed"
    assert fakes.JOURNAL.count(("test.flaky", "u")) == 2
    assert "undone: a" in (ex.error or "")


def test_a_step_whose_locks_were_lost_in_the_wait_before_a_retry_is_held(
        make_bot: BotFactory) -> None:
    """Someone else may be working on its nodes now: no further attempt, a person decides."""
    fakes.FAILURES["f"] = 99
    bot = make_bot({"demo": runbook([{
        "id": "f", "action": "test.flaky", "with": {"key": "f"}, "retries": 2,
        "retry_delay": "1s"}])})
    second = request(bot)
    ex = run(engine_for(bot, Sleeps(then=lambda: drop_locks(bot, second))), second)
    assert ex.state == "held"
    assert "no longer holds its locks" in (ex.error or "")
    assert fakes.JOURNAL == [("test.flaky", "f")]


# --- the watcher -------------------------------------------------------------------------


def test_a_step_is_stopped_at_its_deadline_and_that_is_reported_as_its_timeout(
        make_bot: BotFactory, clock: Clock) -> None:
    def at_the_deadline(args: Any, ctx: ActionContext) -> ActionResult:
        clock.move_to(ctx.deadline)  # exactly the step's timeout after it started
        if not asked_to_stop(ctx, clock):
            return ActionResult(summary="never asked to stop")
        raise ActionStopped(f"{ctx.step_id}: stopped: {ctx.stop_reason}")

    SCRIPTS["slow"] = at_the_deadline
    bot = with_scripts(make_bot({"demo": runbook([
        record("a", "a"), scripted("slow", "slow", timeout="1s")])}))
    ex = run(engine_for(bot), request(bot))
    failed = step_events(bot, ex.id, "step_failed")
    assert [e["error"] for e in failed] == [
        "did not finish within 1s (the step's timeout): slow: stopped: the step's timeout (1s) "
        "passed"]
    assert ex.state == "failed" and fakes.STATE == {"a": False}  # undone once it returned


@pytest.mark.parametrize("late", [0.0, 0.001])
def test_a_step_that_stops_within_its_grace_is_undone_one_later_is_held(
        make_bot: BotFactory, clock: Clock, late: float) -> None:
    """Asked to stop at its timeout, the step stops ``grace + late`` seconds later (by the
    watcher's clock): at the grace itself it fails and is undone; a moment after, the
    watcher has held the run, nothing undone beside a step that may still be running."""

    def lingering(args: Any, ctx: ActionContext) -> ActionResult:
        clock.move_to(ctx.deadline)
        assert asked_to_stop(ctx, clock)
        clock.move_to(ctx.deadline + 2.0 + late, reads=2)  # the watcher judged this time
        raise ActionStopped(f"{ctx.step_id}: stopped late")

    SCRIPTS["slow"] = lingering
    bot = with_scripts(make_bot({"demo": runbook([
        record("a", "a"), scripted("slow", "slow", timeout="1s")])},
        engine={"stop_grace_seconds": 2.0}))
    ex = run(engine_for(bot), request(bot))
    if late:
        assert ex.state == "held"
        assert fakes.STATE == {"a": True}
        assert (ex.error or "").startswith(
            "step slow was asked to stop (the step's timeout (1s) passed) and did not within "
            "2s: it may still be running. Nothing was undone.")
    else:
        assert ex.state == "failed" and fakes.STATE == {"a": False}
        assert "did not finish within 1s (the step's timeout): slow: stopped late" in (
            ex.error or "")


def test_a_claim_lost_as_a_step_starts_stops_it_and_then_the_engine(
        make_bot: BotFactory, clock: Clock) -> None:
    """The claim is lost after the step was recorded as running but before its action was
    registered (so the loss itself could not tell it): the watcher tells it, saying why;
    when it does not stop within the grace the engine stops driving (writing nothing)."""
    told: list[str] = []
    ended = threading.Event()

    def stubborn(args: Any, ctx: ActionContext) -> ActionResult:
        try:
            assert asked_to_stop(ctx, clock)
            told.append(ctx.stop_reason)
            clock.move_to(clock.now + 3.0, reads=2)  # past the grace of 2 s
            return ActionResult(summary="done at last")
        finally:
            ended.set()

    SCRIPTS["slow"] = stubborn
    bot = with_scripts(make_bot({"demo": runbook([scripted("slow", "slow", timeout="1h")])},
                                engine={"stop_grace_seconds": 2.0}))
    lines: list[str] = []
    holder: dict[str, Engine] = {}

    def heard(execution_id: int, line: str) -> None:
        lines.append(line)
        if line.startswith("step slow: running"):
            for claim in holder["engine"].claims.held():
                claim.lose("another engine took the lease (test)")

    engine = holder["engine"] = Engine(bot, report=heard, sleep=lambda s: None)
    ex = run(engine, request(bot))
    assert ended.wait(DEADLINE)
    assert told == ["this engine lost the execution: another engine took the lease (test)"]
    assert (f"stopped driving: execution {ex.id}: another engine took the lease (test); "
            "step slow did not stop within 2s") in lines
    assert ex.state == "running"


def test_a_cancel_stops_a_running_step_but_not_a_running_undo(
        make_bot: BotFactory, clock: Clock) -> None:
    def cancelled_while_running(args: Any, ctx: ActionContext) -> ActionResult:
        bot.cancel(ctx.execution_id, "alice")
        if not asked_to_stop(ctx, clock):
            return ActionResult(summary="never asked to stop")
        raise ActionStopped(f"{ctx.step_id}: stopped: {ctx.stop_reason}")

    def slow_undo(args: Any, ctx: ActionContext) -> ActionResult:
        if asked_to_stop(ctx, clock, reads=5):  # five turns of the watcher, cancel set
            raise ActionStopped(f"{ctx.step_id}: undo stopped: {ctx.stop_reason}")
        fakes.STATE["a"] = False
        return ActionResult(summary="forgot a")

    SCRIPTS.update(wait=cancelled_while_running, forget=slow_undo)
    steps = [undone_by(record("a", "a"), "test.scripted", "forget"),
             scripted("wait", "wait", timeout="1h")]
    bot = with_scripts(make_bot({"demo": runbook(steps)}))
    ex = run(engine_for(bot), request(bot))
    assert [e["error"] for e in step_events(bot, ex.id, "step_failed")] == [
        "wait: stopped: the execution was cancelled"]
    assert ex.state == "cancelled"
    assert fakes.STATE == {"a": False}
    assert (ex.error or "").startswith("cancelled on request; undone: a")


# --- what comes back from a step with a secret parameter ------------------------------


def test_a_successful_step_keeps_its_summary_details_and_changed_with_the_secret_masked(
        make_bot: BotFactory, tmp_path: Path) -> None:
    def echo(args: Any, ctx: ActionContext) -> ActionResult:
        return ActionResult(summary=f"sent {args.text}",
                            details={"sent": args.text, "to": "gpu01"}, changed=False)

    SCRIPTS["echo"] = echo
    bot = with_scripts(make_keyed(make_bot, tmp_path, [{
        "id": "use", "action": "test.scripted",
        "with": {"key": "echo", "text": "Bearer {{ token }}"}}]))
    execution_id = bot.request("keyed", {"node": "gpu01", "token": SECRET}, "alice")
    engine = engine_for(bot)
    try:
        ex = drive(engine, execution_id)
    finally:
        engine.close()
    assert ex.state == "succeeded"
    finished = step_events(bot, execution_id, "step_finished")
    assert finished == [{
        "step": "use", "attempt": 1, "state": "succeeded",
        "summary": "sent Bearer [secret:token]",
        "details": {"sent": "Bearer [secret:token]", "to": "gpu01"}, "changed": False}]

"""The engine's safety promises, each tried the way it broke before: a cancel that did not
reach a waiting step (or the last one), a changed runbook run without approval, a lost
heartbeat letting two engines run one step, an approved execution that lost its locks
looping forever, and a timed-out step overlapping its undo."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import update

from bot.execution import executions
from bot.execution.checks.core import Checks, CommandEvaluator
from bot.execution.engine import Engine
from bot.runbooks.catalogue import KNOWN, Catalogue
from bot.service import Service
from bot.store import audit
from bot.store.db import now_iso
from bot.store.schema import locks, maintenance_windows
from tests.bot import fakes
from tests.bot.execution.bounded import drive, run_pending_once
from tests.bot.execution.test_engine import record, runbook
from tests.bot.schedule.windowfakes import Systems
from tests.conftest import BotFactory


@pytest.fixture(autouse=True)
def _clean() -> None:
    fakes.reset()


def gate(key: str, seconds: float = 60, **extra: Any) -> dict[str, Any]:
    return {"id": key, "action": "test.gate", "with": {"key": key, "seconds": seconds, **extra}}


def kinds(bot: Service, execution_id: int) -> list[str]:
    with bot.db.connect() as conn:
        return [e["kind"] for e in audit.events(conn, execution_id=execution_id)]


def events(bot: Service, execution_id: int) -> list[dict[str, Any]]:
    with bot.db.connect() as conn:
        return list(audit.events(conn, execution_id=execution_id))


def drive_in_thread(engine: Engine, execution_id: int) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: box.update(ex=drive(engine, execution_id)),
                              daemon=True)
    worker.start()
    return worker, box


def wait_for(condition: Any, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


# --- 1. cancel reaches a waiting step, the last one included, and post-checks ---------------


def test_a_cancel_says_which_nodes_stay_out_for_want_of_an_undo(make_bot: BotFactory) -> None:
    """swap-gpu's drain has no undo (a node found faulty stays out): a cancel says so."""
    systems = Systems(["gpu01", "gpu02"], [])
    drain = {"id": "drain", "action": "slurm.drain", "with": {"nodes": "{{ node }}",
                                                             "reason": "swap GPU 1"}}
    bot = make_bot({"demo": runbook([drain, gate("replaced")], pre_checks=[{
        "name": "capacity", "capacity": {"pool_of": "{{ node }}", "min_free_gpus_after": 0}}])})
    bot.catalogue = Catalogue([*bot.catalogue._actions.values(), *systems.actions()], KNOWN)
    systems.guarding(bot)
    bot.backends = {"slurm": systems.slurm}  # the end of the message reads where nodes stand
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    engine = Engine(bot, sleep=lambda s: None)
    worker, box = drive_in_thread(engine, execution_id)
    wait_for(lambda: "replaced" in fakes.STARTED)
    bot.cancel(execution_id, "alice")
    worker.join(10)
    engine.close()
    assert not worker.is_alive()
    assert box["ex"].state == "cancelled"
    assert box["ex"].error == (
        "cancelled on request; nothing to undo; still out of service (no undo): drain: the "
        "nodes stay out until a runbook returns them (resume-node). state now: gpu01: Slurm "
        f'drained ("swap GPU 1 (execution {execution_id})"); next: resume-node node=gpu01 '
        "once it is serviced")
    assert "DRAIN" in systems.slurm.state["gpu01"].flags


@pytest.mark.parametrize("last", [True, False])
def test_cancel_reaches_a_waiting_step_and_undoes(make_bot: BotFactory, last: bool) -> None:
    steps = [record("a", "a"), gate("wait")] + ([] if last else [record("b", "b")])
    bot = make_bot({"demo": runbook(steps)})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    engine = Engine(bot, sleep=lambda s: None)
    worker, box = drive_in_thread(engine, execution_id)
    wait_for(lambda: "wait" in fakes.STARTED)
    bot.cancel(execution_id, "alice")
    worker.join(10)  # the gate waits 60 s unless stopped
    engine.close()
    assert not worker.is_alive()
    failed = [e["data"] for e in events(bot, execution_id) if e["kind"] == "step_failed"]
    assert [(f["step"], f["error"]) for f in failed] == [
        ("wait", "wait: stopped while waiting at gate wait: the execution was cancelled")]
    assert box["ex"].state == "cancelled"
    assert fakes.STATE == {"a": False}  # undone
    assert ("test.record", "b") not in fakes.JOURNAL
    assert "post-check" not in " ".join(kinds(bot, execution_id))


def test_cancel_during_a_post_check_that_waits(make_bot: BotFactory) -> None:
    checks = [{"name": "never passes", "command": "false-cmd", "expect": "== 0",
               "within": "2m"}]
    bot = make_bot({"demo": runbook([record("a", "a")], post_checks=checks)},
                   host_commands={"false-cmd": {"argv": ["false"]}})
    command = CommandEvaluator(bot.config.host_commands)
    polled = threading.Event()

    def evaluate(check: Any, deadline: float) -> Any:
        try:
            return command(check, deadline)
        finally:
            polled.set()  # the check has failed once: the engine is in its polling now

    bot.checks = Checks({"command": evaluate})  # the real sleep between two polls
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    engine = Engine(bot)
    worker, box = drive_in_thread(engine, execution_id)
    assert polled.wait(10)
    bot.cancel(execution_id, "alice")
    worker.join(10)  # the check polls for 2 minutes unless stopped
    engine.close()
    assert not worker.is_alive()
    assert box["ex"].state == "cancelled"
    assert fakes.STATE == {"a": False}


class _LateCancel(Engine):
    """An engine that does not see the flag (a cancel landing after its last look)."""

    def _cancel_requested(self, ex: Any) -> bool:
        return False


def test_a_cancel_after_the_last_look_still_undoes(make_bot: BotFactory) -> None:
    bot = make_bot({"demo": runbook([record("a", "a"), gate("last", seconds=0.3)])})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    engine = _LateCancel(bot, sleep=lambda s: None)
    worker, box = drive_in_thread(engine, execution_id)
    wait_for(lambda: "last" in fakes.STARTED)
    bot.cancel(execution_id, "alice")
    worker.join(10)
    engine.close()
    assert not worker.is_alive()
    assert box["ex"].state == "cancelled"  # the ending is a compare-and-set on the flag
    assert fakes.STATE == {"a": False}


# --- 2. an execution is pinned to the version it was requested with --------------------


def test_a_changed_runbook_file_does_not_change_what_runs(make_bot: BotFactory) -> None:
    bot = make_bot({"demo": runbook([record("a", "a")])})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")  # low risk: approved
    folder = Path(bot.config.runbook_paths[0])
    changed = runbook([record("a", "a"), record("evil", "evil")], risk="high", version="2.0.0")
    (folder / "demo.yaml").write_text(yaml.safe_dump(changed, sort_keys=False))
    bot._runbooks = None  # the engine sees the new file
    assert bot.runbook("demo").runbook.version == "2.0.0"
    engine = Engine(bot, sleep=lambda s: None)
    ex = drive(engine, execution_id)
    engine.close()
    assert ex.state == "succeeded"
    assert fakes.JOURNAL == [("test.record", "a")]  # never the new step
    started = next(e for e in events(bot, execution_id) if e["kind"] == "started")
    assert started["data"]["version"] == "1.0.0"
    assert ex.version == "1.0.0" and [s.id for s in ex.plan.steps] == ["a"]


def _open_window_over(bot: Service, nodes: str) -> int:
    now = now_iso()
    with bot.db.begin() as conn:
        result = conn.execute(maintenance_windows.insert().values(
            nodes=nodes, starts_at=now, duration_seconds=3600, reason="test", runbooks="[]",
            plans="[]", digest="", created_by="carol", created_at=now, state="open",
            runs="[]", updated_at=now))
        key = result.inserted_primary_key
        assert key is not None
        return int(key[0])


def test_a_plan_that_now_needs_approval_is_asked_never_run(make_bot: BotFactory) -> None:
    """Approved with no approval needed inside a window; at start the window has closed, so
    the plan made now needs one: it waits for a person, nothing runs on the old decision."""
    bot = make_bot({"demo": runbook([record("a", "a")], windows="required")})
    window = _open_window_over(bot, "gpu01")
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    assert bot.get(execution_id).state == "approved"
    with bot.db.begin() as conn:
        conn.execute(update(maintenance_windows).where(maintenance_windows.c.id == window)
                     .values(state="closed"))
    engine = Engine(bot, sleep=lambda s: None)
    ex = drive(engine, execution_id, wait_for_approval=False)
    assert ex.state == "awaiting_approval"
    assert ex.plan.approval.required == 1 and ex.plan.outside_window
    assert ex.approvals_required == 1  # the row asks for the new plan's approvals too
    assert fakes.JOURNAL == []
    voided = next(e for e in events(bot, execution_id) if e["kind"] == "approval_voided")
    assert "outside_window" in voided["data"]["what"]
    bot.approve(execution_id, "carol")
    assert drive(engine, execution_id).state == "succeeded"
    engine.close()


# --- 4. a heartbeat that fails: the engine stops itself, another takes over ----------------


def lease_over(bot: Service, execution_id: int) -> bool:
    """Whether the execution's lease has run out (by the clock the engines claim with)."""
    lease_until = bot.get(execution_id).lease_until
    return lease_until is not None and lease_until < time.time()


def test_an_engine_that_cannot_renew_stops_before_another_takes_over(
        make_bot: BotFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    bot = make_bot({"demo": runbook([gate("slow", seconds=30)])},
                   engine={"lease_seconds": 1.0, "poll_seconds": 0.05,
                           "clock_skew_seconds": 0.2})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    first = Engine(bot, owner="first", sleep=lambda s: None)

    def broken(claims: Any) -> None:
        raise RuntimeError("database is locked")

    monkeypatch.setattr(first.claims, "renew", broken)  # the heartbeat fails from now on
    worker, box = drive_in_thread(first, execution_id)
    wait_for(lambda: "slow" in fakes.STARTED)
    worker.join(10)  # it gives the claim up by itself and stops the action
    assert not worker.is_alive()
    assert fakes.CONCURRENCY["now"] == 0
    assert box["ex"].state == "running"
    wait_for(lambda: lease_over(bot, execution_id))  # nobody renews it: it runs out
    fakes.GATES.setdefault("slow", threading.Event()).set()
    second = Engine(bot, owner="second", sleep=lambda s: None)
    ex = drive(second, execution_id)
    first.close()
    second.close()
    assert ex.state == "succeeded"
    assert fakes.CONCURRENCY["max"] == 1  # never two engines in the step at once
    seen = events(bot, execution_id)
    assert seen[-1]["kind"] == "finished"
    assert {e["data"].get("epoch") for e in seen if e["kind"] == "step_started"} == {1, 2}


def test_an_engine_whose_epoch_is_gone_writes_nothing(make_bot: BotFactory) -> None:
    bot = make_bot({"demo": runbook([gate("slow", seconds=30)])})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    first = Engine(bot, owner="first", sleep=lambda s: None)
    worker, _ = drive_in_thread(first, execution_id)
    wait_for(lambda: "slow" in fakes.STARTED)
    with bot.db.begin() as conn:  # another engine claimed it (the lease had run out)
        executions.update_if(conn, execution_id, {}, epoch=99, owner="other",
                             lease_until=time.time() + 60)
    first.claims.renew(first.claims.held())
    worker.join(10)
    first.close()
    assert not worker.is_alive()
    assert fakes.CONCURRENCY["now"] == 0  # told the action to stop
    assert kinds(bot, execution_id)[-1] == "step_started"  # and wrote nothing after


# --- 6. an approved execution that lost its locks before it started ----------------------


def test_lost_locks_before_start_fail_it_and_engine_once_returns(make_bot: BotFactory) -> None:
    bot = make_bot({"demo": runbook([record("a", "{{ node }}")])})
    first = bot.request("demo", {"node": "gpu01"}, "alice")
    with bot.db.begin() as conn:
        conn.execute(update(locks).values(expires_at=time.time() - 1))
    second = bot.request("demo", {"node": "gpu01"}, "bob")  # takes the expired locks
    engine = Engine(bot, sleep=lambda s: None)
    try:
        run_pending_once(engine)  # returns: the lost one does not loop forever
    finally:
        engine.close()
    assert bot.get(first).state == "failed"
    assert "lost its locks" in (bot.get(first).error or "")
    assert bot.get(second).state == "succeeded"
    assert fakes.JOURNAL == [("test.record", "gpu01")]  # once: the second's


# --- 11. a timeout never overlaps the undo ---------------------------------------------


def test_undo_starts_only_after_the_timed_out_action_returned(make_bot: BotFactory) -> None:
    steps = [record("a", "a"), {**gate("slow", seconds=30), "timeout": "300ms"}]
    bot = make_bot({"demo": runbook(steps)})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    engine = Engine(bot, sleep=lambda s: None)
    ex = drive(engine, execution_id)
    engine.close()
    assert ex.state == "failed" and "timed out" in (ex.error or "")
    assert fakes.EXITS == ["slow"]
    assert fakes.STATE == {"a": False}


def test_an_action_that_ignores_its_timeout_is_held_not_undone(make_bot: BotFactory) -> None:
    steps = [record("a", "a"), {**gate("stuck", seconds=3, ignore_stop=True), "timeout": "200ms"}]
    bot = make_bot({"demo": runbook(steps)},
                   engine={"lease_seconds": 2, "poll_seconds": 0.05, "stop_grace_seconds": 0.5})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    engine = Engine(bot, sleep=lambda s: None)
    ex = drive(engine, execution_id)
    engine.close()
    assert ex.state == "held"
    assert fakes.STATE == {"a": True}  # nothing undone beside a step still running
    held = next(e for e in events(bot, execution_id) if e["kind"] == "held")
    assert "did not within 0.5s" in held["data"]["why"]
    wait_for(lambda: fakes.EXITS == ["stuck"], 5)

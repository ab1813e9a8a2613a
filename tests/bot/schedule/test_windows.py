"""Maintenance windows over in-memory Slurm, Kubernetes and Alertmanager (the real actions):
opening reserves, cordons (only what was not cordoned), silences and notifies; the runbooks
inside run one after the other with the approvals collected ahead; closing reverses each and
reports what ran; a changed plan waits for approval; ``windows: required`` asks one more
approval outside a window; bad input is refused with nothing stored. With a controllable
clock, the scheduler opens a window at its start, closes it at its end, and reports a start
found past the misfire grace as missed. A window holds its nodes' locks from opening to
closing: its own runs take them, anybody else is refused with the window named."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeAlias

import pytest
import time_machine
from sqlalchemy import func, select

from adapters.kubernetes.config import KubernetesConfig
from adapters.kubernetes.cordons import FAILED_CHECK
from adapters.kubernetes.gpu_gate import GpuGateNodesAction
from adapters.slurm.config import SlurmConfig
from adapters.slurm.release import ReservationReleaseAction
from bot.alerts import proposing
from bot.alerts.proposing import Webhook, WebhookAlert
from bot.execution import locking
from bot.execution.engine import Engine
from bot.runbooks.catalogue import Catalogue
from bot.schedule import windows
from bot.schedule.scheduler import Scheduler
from bot.service import Service
from bot.store import audit
from bot.store.schema import locks as locks_table
from bot.store.schema import maintenance_windows
from bot.surfaces.chat.words import runbook_list
from bot.surfaces.slack.poster import Poster
from kit.errors import Refused
from tests.bot import fakes
from tests.bot.execution.test_engine import record, runbook
from tests.bot.schedule.windowfakes import Systems
from tests.bot.surfaces.slack.test_poster_checkpoints import RecordingClient
from tests.conftest import BotFactory

RUNBOOKS = Path(__file__).resolve().parents[3] / "runbooks"
T0 = datetime(2026, 3, 2, 1, 0, tzinfo=UTC)
# What the clock fixture yields; a string, so that time-machine 2 (Coordinates) still imports.
Clock: TypeAlias = "time_machine.Traveller"


@pytest.fixture(autouse=True)
def _clean() -> None:
    fakes.reset()


@pytest.fixture
def systems() -> Systems:
    return Systems(["gpu01", "gpu02", "gpu03", "gpu04"], ["gpu04"])


def strict(**extra: Any) -> dict[str, Any]:
    """A medium-risk runbook that requires a maintenance window."""
    return runbook([record("a", "{{ node }}")], risk="medium", name="strict",
                   windows="required", **extra)


def window_bot(make_bot: BotFactory, systems: Systems, url: str | None = None,
               **overrides: Any) -> Service:
    made = make_bot({
        "open-window": (RUNBOOKS / "open-window.yaml").read_text(),
        "close-window": (RUNBOOKS / "close-window.yaml").read_text(),
        "demo": runbook([record("a", "{{ node }}")]),
        "strict": strict(),
        "flaky": runbook([{"id": "a", "action": "test.flaky", "with": {"key": "{{ node }}"}}],
                         name="flaky"),
        # a drain that declares no lock: planning locks its node all the same
        "drain": runbook([record("a", "{{ node }}")], name="drain", locks=[]),
        # runs until the test opens its gate
        "gated": runbook([{"id": "a", "action": "test.gate", "with": {"key": "{{ node }}"}}],
                         name="gated", locks=[]),
    }, url=url, **overrides)
    made.catalogue = Catalogue([*made.catalogue._actions.values(), *systems.actions()])
    return systems.guarding(made)


@pytest.fixture
def bot(make_bot: BotFactory, systems: Systems) -> Service:
    return window_bot(make_bot, systems)


@pytest.fixture
def any_bot(make_bot: BotFactory, systems: Systems, db_url: str) -> Service:
    """The same bot on each database the store supports."""
    return window_bot(make_bot, systems, db_url)


def drive(bot: Service) -> None:
    """Advance windows and run what is runnable until nothing moves."""
    engine = Engine(bot, sleep=lambda s: None)
    try:
        for _ in range(20):
            notes = windows.advance(bot)
            engine.run_pending(once=True)
            if not notes and not windows.advance(bot):
                return
    finally:
        engine.close()


def kinds(bot: Service) -> list[str]:
    with bot.db.connect() as conn:
        return [e["kind"] for e in audit.events(conn)]


def stored(bot: Service) -> int:
    with bot.db.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(maintenance_windows))
                   .scalar_one())


def create(bot: Service, runbooks: str = "", user: str = "alice", start: str = "2030-01-01 02:00",
           nodes: str = "gpu[03-04]") -> windows.Window:
    return windows.create(bot, nodes, user, start=start, duration="2h",
                          runbooks=runbook_list(runbooks), reason="firmware update")


def test_a_window_opens_runs_its_runbooks_and_closes(bot: Service, systems: Systems) -> None:
    window = create(bot, runbooks="demo node=gpu03; strict node=gpu04")
    assert window.state == windows.SCHEDULED
    assert [p["runbook"] for p in window.plans] == ["open-window", "demo", "strict"]
    windows.approve(bot, window.id, "carol")
    assert windows.fire_open(bot, window.id) == "opening"
    drive(bot)
    window = windows.get(bot, window.id)
    assert window.state == windows.OPEN
    assert set(systems.slurm.reserved) == {f"window-{window.id}"}
    assert systems.slurm.reserved[f"window-{window.id}"].nodes == ["gpu03", "gpu04"]
    assert systems.cordoned() == {"gpu04": f"window-{window.id}"}
    assert systems.alertmanager.active() == ['alertname!~"Gpu.*" node=~"gpu03|gpu04"']
    assert fakes.JOURNAL == [("test.record", "gpu03"), ("test.record", "gpu04")]
    assert [run["state"] for run in window.runs] == ["succeeded", "succeeded"]
    strict_run = bot.get(window.runs[1]["execution_id"])
    assert strict_run.approvals_required == 1  # inside the window: no extra approval
    assert bot.approvals(strict_run.id) == ["carol"]
    assert windows.fire_close(bot, window.id) == "closing"
    drive(bot)
    window = windows.get(bot, window.id)
    assert window.state == windows.CLOSED
    assert systems.slurm.reserved == {}
    assert systems.cordoned() == {}
    assert systems.alertmanager.active() == []
    assert window.report is not None
    assert "demo node=gpu03 (execution" in window.report and "succeeded" in window.report
    assert window.close_execution_id is not None
    close = bot.get(window.close_execution_id)
    assert close.state == "succeeded" and close.runbook == "close-window"
    for kind in ("window_created", "window_approved", "window_opening", "window_opened",
                 "window_closing", "window_closed"):
        assert kind in kinds(bot)
    assert audit.verify(bot.db).ok


def test_a_node_cordoned_before_the_window_stays_cordoned(bot: Service, systems: Systems) -> None:
    systems.kubernetes.patch_node("gpu04", {"spec": {"unschedulable": True}})
    window = create(bot)
    windows.approve(bot, window.id, "carol")
    windows.open_now(bot, window.id, "alice")
    drive(bot)
    assert windows.get(bot, window.id).state == windows.OPEN
    assert systems.cordoned() == {"gpu04": None}  # not marked as the window's
    windows.cancel(bot, window.id, "alice")  # an open window closes now
    drive(bot)
    assert windows.get(bot, window.id).state == windows.CLOSED
    assert systems.cordoned() == {"gpu04": None}  # still the other person's cordon


def test_without_approvals_ahead_opening_waits_for_approval(bot: Service,
                                                            systems: Systems) -> None:
    window = create(bot)
    windows.fire_open(bot, window.id)
    drive(bot)
    window = windows.get(bot, window.id)
    assert window.state == windows.OPENING and window.open_execution_id is not None
    assert bot.get(window.open_execution_id).state == "awaiting_approval"
    assert systems.slurm.reserved == {}
    bot.approve(window.open_execution_id, "dave")
    drive(bot)
    assert windows.get(bot, window.id).state == windows.OPEN


def test_an_approval_ahead_that_races_the_opening_still_counts(
        bot: Service, systems: Systems, monkeypatch: pytest.MonkeyPatch) -> None:
    """start=now: the window opens (its execution requested, awaiting approval) between the
    approve's state check and its record; the approval reaches that execution anyway."""
    window = create(bot)
    plans = windows._current_plans

    def opening_meanwhile(bot_: Service, window_: windows.Window) -> Any:
        found = plans(bot_, window_)
        windows.fire_open(bot_, window_.id)
        return found

    monkeypatch.setattr(windows, "_current_plans", opening_meanwhile)
    _, names, note = windows.approve(bot, window.id, "carol")
    window = windows.get(bot, window.id)
    assert names == ["carol"] and window.open_execution_id is not None
    assert note == (f"window {window.id} opened meanwhile: approved its open-window "
                    f"execution {window.open_execution_id} as well")
    assert bot.approvals(window.open_execution_id) == ["carol"]
    drive(bot)
    assert windows.get(bot, window.id).state == windows.OPEN


def test_a_changed_plan_does_not_open_unattended(bot: Service, systems: Systems) -> None:
    window = create(bot, runbooks="demo node=gpu03")
    windows.approve(bot, window.id, "carol")
    bot.inventory = replace(bot.inventory, kubernetes=frozenset())  # gpu04 left Kubernetes
    windows.fire_open(bot, window.id)
    drive(bot)
    window = windows.get(bot, window.id)
    assert window.state == windows.OPENING and window.open_execution_id is not None
    opening = bot.get(window.open_execution_id)
    assert opening.state == "awaiting_approval"
    assert bot.approvals(opening.id) == []
    assert "preapproval_voided" in kinds(bot)
    assert systems.slurm.reserved == {} and fakes.JOURNAL == []


def test_the_approver_rules_apply_to_approvals_ahead(bot: Service) -> None:
    window = create(bot, user="carol")
    with pytest.raises(Refused, match="carol created the window and may not approve"):
        windows.approve(bot, window.id, "carol")
    with pytest.raises(Refused, match="bob may not approve open-window"):
        windows.approve(bot, window.id, "bob")
    windows.approve(bot, window.id, "dave")
    with pytest.raises(Refused, match="already approved"):
        windows.approve(bot, window.id, "dave")


def test_windows_required_costs_one_approval_outside_a_window(bot: Service,
                                                              systems: Systems) -> None:
    outside = bot.plan("strict", {"node": "gpu04"})
    assert outside.outside_window and outside.approval.required == 2
    assert bot.plan("demo", {"node": "gpu04"}).approval.required == 0  # not required there
    window = create(bot)
    windows.approve(bot, window.id, "carol")
    windows.open_now(bot, window.id, "alice")
    drive(bot)
    inside = bot.plan("strict", {"node": "gpu04"})
    assert not inside.outside_window and inside.approval.required == 1
    assert bot.plan("strict", {"node": "gpu01"}).outside_window  # not a node of the window
    execution_id = bot.request("strict", {"node": "gpu01"}, "alice")
    assert bot.get(execution_id).approvals_required == 2
    assert bot.approve(execution_id, "carol").state == "awaiting_approval"
    assert bot.approve(execution_id, "dave").state == "approved"
    windows.cancel(bot, window.id, "alice")
    drive(bot)
    assert bot.plan("strict", {"node": "gpu04"}).outside_window


def test_a_plain_plan_keeps_its_hash(bot: Service) -> None:
    """outside_window is left out of a plan's hash unless set: other plans do not change."""
    plan = bot.plan("demo", {"node": "gpu01"})
    assert "outside_window" not in plan.body()


@pytest.mark.parametrize("nodes, start, duration, runbooks, message", [
    ("gpu[03-05]", "2030-01-01 02:00", "2h", "", "gpu05: not known node"),
    ("gpu[0-99999999]", "2030-01-01 02:00", "2h", "", "names 100,000,000 nodes; the inventory "
                                                    "holds 4"),
    ("gpu[03-09]", "2030-01-01 02:00", "2h", "", "names 7 nodes; the inventory holds 4"),
    ("gpu[03", "2030-01-01 02:00", "2h", "", "nodes"),
    ("gpu03", "2020-01-01 02:00", "2h", "", "is in the past"),
    ("gpu03", "tomorrow", "2h", "", 'start="tomorrow" is not a time'),
    ("gpu03", "2030-01-01 02:00", "30d", "", "outside 1m..14d"),
    ("gpu03", "2030-01-01 02:00", "soon", "", "is not a duration"),
    ("gpu03", "2030-01-01 02:00", "2h", "demo node=gpu01", "outside the window's nodes"),
    ("gpu03", "2030-01-01 02:00", "2h", "dmeo node=gpu03", 'did you mean "demo"'),
    ("gpu03", "2030-01-01 02:00", "2h", "demo node=gpu03 x=1", 'unknown parameter "x"'),
    ("gpu03", "2030-01-01 02:00", "2h", "open-window window=1", "what the window itself runs"),
])
def test_bad_input_is_refused_and_nothing_is_stored(bot: Service, nodes: str, start: str,
                                                    duration: str, runbooks: str,
                                                    message: str) -> None:
    with pytest.raises(Refused, match=message):
        windows.create(bot, nodes, "alice", start=start, duration=duration,
                       runbooks=runbook_list(runbooks))
    assert stored(bot) == 0
    assert "window_refused" in kinds(bot)


def test_a_bad_reason_is_refused_by_the_open_plan_and_nothing_is_stored(bot: Service) -> None:
    with pytest.raises(Refused, match="reason"):
        windows.create(bot, "gpu03", "alice", start="2030-01-01 02:00", duration="2h",
                       reason="x; rm -rf /")
    assert stored(bot) == 0


def test_cancel_before_it_opens(bot: Service, systems: Systems) -> None:
    window = create(bot)
    with pytest.raises(Refused, match="bob may not cancel window"):
        windows.cancel(bot, window.id, "bob")
    assert windows.cancel(bot, window.id, "alice").state == windows.CANCELLED
    assert windows.fire_open(bot, window.id).startswith("skipped")
    assert systems.slurm.reserved == {}


def test_a_failed_inside_run_stops_the_rest(bot: Service, systems: Systems) -> None:
    fakes.FAILURES["gpu03"] = 5
    window = create(bot, runbooks="flaky node=gpu03; demo node=gpu04")
    windows.approve(bot, window.id, "carol")
    windows.open_now(bot, window.id, "alice")
    drive(bot)
    window = windows.get(bot, window.id)
    assert [run["state"] for run in window.runs] == ["failed",
                                                     "not run: flaky failed before it"]
    assert ("test.record", "gpu04") not in fakes.JOURNAL
    windows.fire_close(bot, window.id)
    drive(bot)
    window = windows.get(bot, window.id)
    assert window.state == windows.CLOSED
    assert window.report is not None and "not run: flaky failed before it" in window.report


# --- with the scheduler and a controllable clock ---------------------------------------------


@pytest.fixture
def clock() -> Iterator[Clock]:
    with time_machine.travel(T0, tick=False) as traveller:
        yield traveller


def test_the_scheduler_opens_and_closes_a_window(bot: Service, systems: Systems,
                                                 clock: Clock) -> None:
    window = create(bot, start="2026-03-02 02:00", runbooks="demo node=gpu03")
    windows.approve(bot, window.id, "carol")
    runner = Scheduler(bot)
    runner.start()
    try:
        runner.settle()
        assert runner.jobs() == {f"window:{window.id}:open": T0 + timedelta(hours=1),
                                 f"window:{window.id}:close": T0 + timedelta(hours=3)}
        clock.move_to(T0 + timedelta(hours=1, seconds=1))
        runner.settle()
        drive(bot)
        assert windows.get(bot, window.id).state == windows.OPEN
        runner.tick()  # an open window no longer has an open job
        assert list(runner.jobs()) == [f"window:{window.id}:close"]
        assert systems.cordoned() == {"gpu04": f"window-{window.id}"}
        clock.move_to(T0 + timedelta(hours=3, seconds=1))
        runner.settle()
        drive(bot)
        assert windows.get(bot, window.id).state == windows.CLOSED
        runner.tick()
        assert runner.jobs() == {}
    finally:
        runner.stop()
    assert systems.slurm.reserved == {} and systems.cordoned() == {}
    assert fakes.JOURNAL == [("test.record", "gpu03")]


def test_a_start_found_past_the_grace_is_missed(bot: Service, systems: Systems,
                                                clock: Clock) -> None:
    window = create(bot, start="2026-03-02 02:00")
    windows.approve(bot, window.id, "carol")
    clock.move_to(T0 + timedelta(hours=1, minutes=20))  # the bot was down at 02:00
    runner = Scheduler(bot)
    runner.start()
    try:
        runner.settle()
        assert windows.get(bot, window.id).state == windows.MISSED
        runner.tick()  # a missed window has nothing left to fire
        assert list(runner.jobs()) == []
    finally:
        runner.stop()
    assert systems.slurm.reserved == {}
    assert "window_missed" in kinds(bot)


def test_an_end_is_dealt_with_however_late(bot: Service, systems: Systems, clock: Clock) -> None:
    window = create(bot, start="2026-03-02 02:00")
    windows.approve(bot, window.id, "carol")
    clock.move_to(T0 + timedelta(hours=1, minutes=1))
    runner = Scheduler(bot)
    runner.start()
    try:
        runner.settle()
        drive(bot)
        assert windows.get(bot, window.id).state == windows.OPEN
    finally:
        runner.stop()
    clock.move_to(T0 + timedelta(hours=9))  # down over the end, for hours
    runner = Scheduler(bot)
    runner.start()
    try:
        runner.settle()
        drive(bot)
    finally:
        runner.stop()
    assert windows.get(bot, window.id).state == windows.CLOSED
    assert systems.cordoned() == {}


# --- a window holds its nodes -----------------------------------------------------------------


def held_locks(bot: Service) -> dict[str, int]:
    with bot.db.connect() as conn:
        return {row.name: row.execution_id for row in conn.execute(select(locks_table))}


def test_an_open_window_refuses_others_on_its_nodes_while_its_own_run_goes_on(
        any_bot: Any, systems: Systems) -> None:
    bot = any_bot
    window = create(bot, nodes="gpu03", runbooks="gated node=gpu03")
    windows.approve(bot, window.id, "carol")
    windows.open_now(bot, window.id, "alice")
    started = fakes.STARTED.setdefault("gpu03", threading.Event())
    driver = threading.Thread(target=drive, args=(bot,), daemon=True)
    driver.start()
    try:
        assert started.wait(20), "the window's own run on gpu03 did not start"
        window = windows.get(bot, window.id)
        assert window.state == windows.OPEN
        inner = window.runs[0]["execution_id"]
        assert bot.get(inner).state == "running"
        assert held_locks(bot) == {"node:gpu03": inner}  # lent to the window's run
        for user in ("bob", "alice"):  # anybody else, its creator asking by hand too
            with pytest.raises(Refused, match=rf"node:gpu03 is held by maintenance window "
                                              rf"{window.id} \(open on gpu03 until .*created "
                                              rf"by alice\); lent now to its run, execution "
                                              rf"{inner} \(gated\)"):
                bot.request("drain", {"node": "gpu03"}, user)
        other = bot.request("drain", {"node": "gpu01"}, "bob")  # not the window's node
    finally:
        fakes.GATES.setdefault("gpu03", threading.Event()).set()
        driver.join(30)
    assert not driver.is_alive()
    window = windows.get(bot, window.id)
    assert [run["state"] for run in window.runs] == ["succeeded"]
    # the run ended: the lock went back to the window, which still refuses others
    assert held_locks(bot)["node:gpu03"] == window.open_execution_id
    assert bot.get(other).terminal  # the engine ran it too, beside the window
    with pytest.raises(Refused, match=rf"node:gpu03 is held by maintenance window {window.id} "
                                      r"\(open on gpu03"):
        bot.request("drain", {"node": "gpu03"}, "bob")
    windows.fire_close(bot, window.id)
    drive(bot)
    window = windows.get(bot, window.id)
    assert window.state == windows.CLOSED
    assert bot.get(window.close_execution_id).state == "succeeded"  # it took them too
    assert "node:gpu03" not in held_locks(bot)  # closed: gone
    bot.request("drain", {"node": "gpu03"}, "bob")
    for kind in ("locks_lent", "locks_returned", "locks_released"):
        assert kind in kinds(bot)
    assert audit.verify(bot.db).ok


def test_the_window_holds_its_nodes_from_its_open_request(any_bot: Any) -> None:
    bot = any_bot
    window = create(bot)  # gpu[03-04], no approvals ahead: the opening waits for one
    windows.fire_open(bot, window.id)
    window = windows.get(bot, window.id)
    opening = window.open_execution_id
    assert bot.get(opening).plan.locks == ["node:gpu03", "node:gpu04", f"window:{window.id}"]
    assert held_locks(bot) == {"node:gpu03": opening, "node:gpu04": opening,
                               f"window:{window.id}": opening}
    with pytest.raises(Refused, match=rf"node:gpu04 is held by maintenance window "
                                      rf"{window.id} \(opening on gpu\[03-04\]"):
        bot.request("drain", {"node": "gpu04"}, "bob")
    second = create(bot, nodes="gpu[02-03]")  # overlapping windows: the second cannot open
    assert windows.fire_open(bot, second.id).startswith(
        f"refused: node:gpu03 is held by maintenance window {window.id}")
    assert windows.get(bot, second.id).state == windows.FAILED
    assert "node:gpu02" not in held_locks(bot)
    bot.approve(opening, "dave")
    drive(bot)
    assert windows.get(bot, window.id).state == windows.OPEN
    # open-window ended: its window:ID lock went, the node locks stay the window's
    assert held_locks(bot) == {"node:gpu03": opening, "node:gpu04": opening}
    windows.cancel(bot, window.id, "alice")
    drive(bot)
    assert windows.get(bot, window.id).state == windows.CLOSED
    assert held_locks(bot) == {}


def test_a_window_that_does_not_open_lets_its_nodes_go(any_bot: Any) -> None:
    bot = any_bot
    window = create(bot)
    windows.fire_open(bot, window.id)
    opening = windows.get(bot, window.id).open_execution_id
    bot.deny(opening, "dave", "not tonight")
    drive(bot)
    assert windows.get(bot, window.id).state == windows.FAILED
    assert held_locks(bot) == {}
    bot.request("drain", {"node": "gpu03"}, "bob")


def test_a_window_does_not_open_over_a_node_somebody_holds(any_bot: Any) -> None:
    bot = any_bot
    holder = bot.request("drain", {"node": "gpu04"}, "bob")
    window = create(bot)
    windows.approve(bot, window.id, "carol")
    assert windows.fire_open(bot, window.id).startswith(
        f"refused: node:gpu04 is held by execution {holder} (drain, requested by bob)")
    window = windows.get(bot, window.id)
    assert window.state == windows.FAILED and "node:gpu04 is held" in (window.report or "")
    assert held_locks(bot) == {"node:gpu04": holder}


def test_lock_module_knows_the_states_in_which_a_window_holds_its_nodes() -> None:
    assert set(locking.WINDOW_HOLDS) == {windows.OPENING, windows.OPEN, windows.CLOSING}


# --- a window hides no fault ----------------------------------------------------------


def test_a_gpu_alert_inside_a_window_reaches_people_and_keeps_its_node_out(
        make_bot: BotFactory, systems: Systems) -> None:
    bot = window_bot(make_bot, systems, alert_rules=[
        {"match": {"alertname": "GpuXidFallenOffBus"}, "runbook": "demo",
         "params": {"node": "{{ labels.node }}"}}])
    window = create(bot)  # gpu03 (Slurm) and gpu04 (Slurm and Kubernetes)
    windows.approve(bot, window.id, "carol")
    windows.fire_open(bot, window.id)
    drive(bot)
    assert systems.alertmanager.active() == ['alertname!~"Gpu.*" node=~"gpu03|gpu04"']
    alert = WebhookAlert.model_validate({
        "status": "firing", "labels": {"alertname": "GpuXidFallenOffBus", "node": "gpu04"},
        "fingerprint": "x79", "startsAt": "2030-01-01T02:30:00Z"})
    [proposal] = proposing.receive(bot, Webhook(version="4", status="firing", alerts=[alert]))
    assert (f"gpu04 is inside maintenance window {window.id}: the window keeps it out of "
            "service when it closes") in (proposal.note or "")
    windows.fire_close(bot, window.id)
    drive(bot)
    window = windows.get(bot, window.id)
    assert window.state == windows.CLOSED
    close = bot.get(window.close_execution_id or 0)
    assert close.state == "succeeded", close.error
    assert close.params["faulty"] == "gpu04"
    assert systems.slurm.reserved == {}  # the reservation went, gpu04 stays out:
    assert "DRAIN" in systems.slurm.state["gpu04"].flags
    assert systems.slurm.state["gpu04"].reason.endswith(
        f"(execution {close.id}: failed check)")
    assert "DRAIN" not in systems.slurm.state["gpu03"].flags  # no alert: back in service
    assert systems.cordoned() == {"gpu04": f"window-{window.id}"}  # still cordoned
    assert systems.alertmanager.active() == []  # the window's silence is over
    said = [e["data"] for e in events(bot) if e["kind"] == "step_finished"
            and e["data"].get("step") == "announce"]
    assert said and "KEPT OUT OF SERVICE: gpu04" in said[-1]["summary"]


def test_a_node_missing_a_gpu_at_the_close_stays_out_and_the_close_fails_naming_it(
        bot: Service, systems: Systems) -> None:
    """The GPU gate of close-window: gpu04 (Slurm and Kubernetes) reports 7 GPUs in DCGM
    when the window closes; it stays drained and cordoned, marked as a failed check, gpu03
    returns, the silence ends, and the run fails naming gpu04 and the verdict."""
    window = create(bot)
    windows.approve(bot, window.id, "carol")
    windows.fire_open(bot, window.id)
    drive(bot)
    systems.prometheus.gpus_of["gpu04"] = 7
    windows.fire_close(bot, window.id)
    drive(bot)
    close = bot.get(windows.get(bot, window.id).close_execution_id or 0)
    assert close.state == "failed"
    said = close.error or ""
    assert "KEPT OUT" in said and "gpu04: DCGM reports 7 of 8 GPUs of gpu04: GPU 7" in said
    assert systems.slurm.reserved == {}
    assert "DRAIN" not in systems.slurm.state["gpu03"].flags
    assert systems.slurm.state["gpu04"].reason.startswith("GPU telemetry: DCGM reports 7 of 8")
    assert systems.slurm.state["gpu04"].reason.endswith(f"(execution {close.id}: failed check)")
    assert systems.cordoned() == {"gpu04": f"window-{window.id}"}
    marked = systems.kubernetes.nodes["gpu04"].annotations[FAILED_CHECK]
    assert marked.startswith("GPU telemetry: DCGM reports 7 of 8")
    assert systems.alertmanager.active() == []


def test_close_window_without_prometheus_is_refused_unless_break_glass(
        bot: Service, systems: Systems) -> None:
    bot.catalogue = Catalogue([a for a in bot.catalogue._actions.values()
                               if a.name not in ("k8s.gpu_gate_nodes", "slurm.reservation_release")]
                              + [GpuGateNodesAction(systems.kubernetes, KubernetesConfig()),
                                 ReservationReleaseAction(systems.slurm, SlurmConfig())])
    params = {"window": "9", "nodes": "gpu[03-04]", "slurm_nodes": "gpu[03-04]",
              "k8s_nodes": "gpu04", "alert_nodes": "gpu03,gpu04"}
    with pytest.raises(Refused, match="no Prometheus is configured"):
        bot.plan("close-window", params)
    with pytest.raises(Refused, match="gpu_telemetry"):
        bot.plan("close-window", {**params, "gpu_telemetry": "false"})
    plan = bot.plan("close-window", {**params, "gpu_telemetry": "false"}, break_glass=True)
    assert [s.id for s in plan.steps if not s.skipped] == ["release", "uncordon", "unsilence",
                                                            "announce"]


def events(bot: Service) -> list[dict[str, Any]]:
    with bot.db.connect() as conn:
        return list(audit.events(conn))


def test_a_refusal_by_a_window_past_its_end_says_why_it_still_holds() -> None:
    hold = locking.WindowHold(7, "gpu[04-05]", "closing", "alice", 12, ends_at=1_000_000.0)
    assert hold.describe(now=999_000.0) == (
        "maintenance window 7 (closing on gpu[04-05] until 1970-01-12 13:46 UTC, created by "
        "alice)")
    assert hold.describe(now=1_000_001.0) == (
        "maintenance window 7 (closing on gpu[04-05], past its end at 1970-01-12 13:46 UTC: "
        "it holds its nodes until its runs inside end and close-window has run; created by "
        "alice)")


def test_a_window_past_its_end_says_once_what_it_waits_for(bot: Service, systems: Systems,
                                                          clock: Clock) -> None:
    window = create(bot, start="2026-03-02 02:00")
    waiting = bot.request("demo", {"node": "gpu03"}, "alice")  # not ended: the window waits
    with bot.db.begin() as conn:
        windows._set(conn, window.id, state=windows.CLOSING,
                     runs=[{"runbook": "demo", "execution_id": waiting, "state": "running"}])
    assert windows.overdue(bot) == []  # before its end: closing early is no news
    clock.move_to(T0 + timedelta(hours=3, minutes=5))
    [(late, ids)] = windows.overdue(bot)
    assert (late.id, ids) == (window.id, [waiting])
    client = RecordingClient()
    for poster in (Poster(bot, client, "C1", 1.0), Poster(bot, client, "C1", 1.0)):
        poster.tick()  # two replicas: one message
    said = [m["text"] for m in client.sent if "passed its end" in m["text"]]
    assert said == [f":hourglass: Maintenance window {window.id} passed its end "
                    f"(2026-03-02T04:00:00Z) and is still closing: it waits for execution(s) "
                    f"{waiting} inside it to end before it lifts its reservation, cordons and "
                    "silence. Cancel them to close it now (`/runbook cancel ID`); its nodes "
                    "stay out of service until then."]
    bot.cancel(waiting, "alice")
    assert windows.overdue(bot) == []

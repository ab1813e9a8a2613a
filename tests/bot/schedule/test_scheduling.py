"""Schedules with a controllable clock (time-machine): a fire time runs exactly once across
a restart of the bot (two schedulers one after the other on one database), a fire time
found inside the misfire grace runs once and one found outside it is reported as missed,
coalesced fire times are reported, approvals ahead bind to the plan hash (a changed plan
waits for approval instead of running), bad input is refused with nothing stored."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeAlias

import pytest
import time_machine
import yaml
from sqlalchemy import func, select, update

from bot.execution.engine import Engine
from bot.execution.executions import find
from bot.runtime.tasks import scheduler_task
from bot.schedule import scheduling
from bot.schedule.scheduler import Scheduler
from bot.service import Service
from bot.store import audit
from bot.store.schema import apscheduler_jobs, scheduled_runs, schedules
from bot.surfaces import schedule_text
from kit.errors import Refused
from tests.bot import fakes
from tests.bot.execution.test_engine import record, runbook
from tests.conftest import BotFactory

T0 = datetime(2026, 3, 2, 1, 0, tzinfo=UTC)  # a Monday
# What the clock fixture yields; a string, so that time-machine 2 (Coordinates) still imports.
Clock: TypeAlias = "time_machine.Traveller"


@pytest.fixture(autouse=True)
def _clean() -> None:
    fakes.reset()


@pytest.fixture
def clock() -> Iterator[Clock]:
    with time_machine.travel(T0, tick=False) as traveller:
        yield traveller


def medium(**extra: Any) -> dict[str, Any]:
    return runbook([record("a", "{{ node }}")], risk="medium", name="maint", **extra)


@pytest.fixture
def bot(make_bot: BotFactory) -> Service:
    return make_bot({"demo": runbook([record("a", "{{ node }}")]), "maint": medium()})


@contextmanager
def running(bot: Service) -> Iterator[Scheduler]:
    """One scheduler, started and settled (it has looked at what is due), then stopped."""
    lines: list[str] = []
    runner = Scheduler(bot, lines.append)
    runner.start()
    try:
        runner.settle()
        yield runner
    finally:
        runner.stop()


def executions_of(bot: Service, runbook_name: str = "demo") -> list[Any]:
    with bot.db.connect() as conn:
        return list(reversed(find(conn, runbook=runbook_name)))


def events(bot: Service, kind: str) -> list[dict[str, Any]]:
    with bot.db.connect() as conn:
        return [e for e in audit.events(conn) if e["kind"] == kind]


def drive_all(bot: Service) -> None:
    engine = Engine(bot, sleep=lambda s: None)
    try:
        engine.run_pending(once=True)
    finally:
        engine.close()


def count(bot: Service, table: Any) -> int:
    with bot.db.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def test_a_fire_time_runs_exactly_once_across_a_restart(bot: Service, clock: Clock) -> None:
    added = scheduling.add(bot, "demo", {"node": "gpu01"}, "alice", at="2026-03-02 02:00",
                           tz="UTC")
    with running(bot) as first:
        assert first.jobs() == {f"schedule:{added.id}:1": datetime(2026, 3, 2, 2, 0,
                                                                    tzinfo=UTC)}
        assert executions_of(bot) == []
    clock.move_to(T0 + timedelta(hours=1, minutes=5))  # the bot was down at 02:00
    with running(bot):
        pass
    with running(bot) as third:  # and restarted once more
        assert third.jobs() == {}
    ran = executions_of(bot)
    assert len(ran) == 1
    assert ran[0].requested_by == "alice" and ran[0].params == {"node": "gpu01"}
    requested = [e for e in events(bot, "requested") if e["execution_id"] == ran[0].id]
    assert requested[0]["data"]["source"] == "schedule"
    fired = events(bot, "schedule_fired")
    assert [e["data"]["scheduled_for"] for e in fired] == ["2026-03-02T02:00:00Z"]
    assert scheduling.get(bot, added.id).state == scheduling.DONE
    assert count(bot, scheduled_runs) == 1


def test_the_job_store_lives_in_the_bots_database(make_bot: BotFactory, db_url: str,
                                                  clock: Clock) -> None:
    """SQLite and PostgreSQL alike: the job outlives the scheduler, and fires once."""
    bot = make_bot({"demo": runbook([record("a", "{{ node }}")])}, url=db_url)
    scheduling.add(bot, "demo", {"node": "gpu01"}, "alice", cron="30 * * * *")
    with running(bot):
        pass
    assert count(bot, apscheduler_jobs) == 1
    clock.move_to(T0 + timedelta(minutes=32))
    with running(bot):
        pass
    with running(bot):
        pass
    assert len(executions_of(bot)) == 1
    assert count(bot, scheduled_runs) == 1


def test_a_cron_schedule_fires_once_per_time_across_restarts(bot: Service, clock: Clock) -> None:
    added = scheduling.add(bot, "demo", {"node": "gpu02"}, "alice", cron="30 * * * *")
    with running(bot):
        assert executions_of(bot) == []
    clock.move_to(T0 + timedelta(minutes=31))
    with running(bot) as runner:
        assert len(executions_of(bot)) == 1
        drive_all(bot)  # the first run ends (and gives its node lock back)
        clock.move_to(T0 + timedelta(minutes=45))
        runner.settle()
        assert len(executions_of(bot)) == 1  # nothing due between two fire times
        clock.move_to(T0 + timedelta(hours=1, minutes=30, seconds=2))
        runner.settle()
        assert len(executions_of(bot)) == 2
    with running(bot):
        assert len(executions_of(bot)) == 2
    assert [e["data"]["scheduled_for"] for e in events(bot, "schedule_fired")] == [
        "2026-03-02T01:30:00Z", "2026-03-02T02:30:00Z"]
    assert scheduling.get(bot, added.id).state == scheduling.ACTIVE


def test_a_job_run_again_after_a_crash_requests_nothing_twice(bot: Service, clock: Clock) -> None:
    """APScheduler saves a job's next time only after handing it to its executor: a crash
    in between runs the job again after the restart. Its fire time is already dealt with."""
    added = scheduling.add(bot, "demo", {"node": "gpu01"}, "alice", cron="30 * * * *")
    with running(bot):
        pass
    with bot.db.connect() as conn:
        saved = conn.execute(select(apscheduler_jobs)).one()
    clock.move_to(T0 + timedelta(minutes=31))
    with running(bot):
        assert len(executions_of(bot)) == 1
    with bot.db.begin() as conn:  # the job as it was before it ran: not yet saved
        conn.execute(apscheduler_jobs.update().values(**saved._mapping))
    with running(bot) as runner:
        assert runner.jobs() == {f"schedule:{added.id}:1": T0 + timedelta(hours=1,
                                                                          minutes=30)}
    assert len(executions_of(bot)) == 1
    drive_all(bot)  # the run ends: its lock would not stop another request
    with bot.db.begin() as conn:  # even with the schedule's own record of it lost,
        conn.execute(update(schedules).values(last_handled=None))
    outcome = scheduling.fire(bot, added.id)  # the fire time's run record stops it
    assert (outcome.outcome, outcome.detail) == ("duplicate",
                                                 "2026-03-02T01:30:00Z was already dealt with")
    assert len(executions_of(bot)) == 1


def test_a_fire_time_found_within_the_grace_runs_once(bot: Service, clock: Clock) -> None:
    scheduling.add(bot, "demo", {"node": "gpu01"}, "alice", at="2026-03-02 01:30")
    clock.move_to(T0 + timedelta(minutes=30 + 14))  # grace 15m (the default)
    with running(bot):
        pass
    with running(bot):
        pass
    assert len(executions_of(bot)) == 1
    assert events(bot, "schedule_missed") == []


def test_a_fire_time_found_past_the_grace_is_reported_missed(bot: Service, clock: Clock) -> None:
    added = scheduling.add(bot, "demo", {"node": "gpu01"}, "alice", at="2026-03-02 01:30")
    clock.move_to(T0 + timedelta(minutes=30 + 16))
    with running(bot) as runner:
        assert runner.jobs() == {}
    assert executions_of(bot) == []
    missed = events(bot, "schedule_missed")
    assert len(missed) == 1
    assert missed[0]["data"]["scheduled_for"] == ["2026-03-02T01:30:00Z"]
    assert missed[0]["data"]["late_by_seconds"] == 16 * 60
    found = scheduling.get(bot, added.id)
    assert found.state == scheduling.MISSED and found.missed == 1
    assert "MISSED 1" in schedule_text.schedule_line(bot, found)
    with running(bot):  # reported once, not again at the next start
        pass
    assert len(events(bot, "schedule_missed")) == 1


def test_the_grace_is_configurable(make_bot: BotFactory, clock: Clock) -> None:
    bot = make_bot({"demo": runbook([record("a", "{{ node }}")])},
                   scheduling={"misfire_grace": "1h"})
    scheduling.add(bot, "demo", {"node": "gpu01"}, "alice", at="2026-03-02 01:30")
    clock.move_to(T0 + timedelta(minutes=30 + 50))
    with running(bot):
        pass
    assert len(executions_of(bot)) == 1


def test_coalesced_fire_times_run_once_and_the_rest_are_reported(bot: Service,
                                                                  clock: Clock) -> None:
    added = scheduling.add(bot, "demo", {"node": "gpu01"}, "alice", cron="0 * * * *")
    with running(bot):
        pass
    clock.move_to(datetime(2026, 3, 2, 5, 3, tzinfo=UTC))  # down over 02:00, 03:00, 04:00
    with running(bot):
        pass
    assert len(executions_of(bot)) == 1
    assert [e["data"]["scheduled_for"] for e in events(bot, "schedule_fired")] == [
        "2026-03-02T05:00:00Z"]
    missed = events(bot, "schedule_missed")
    assert missed[0]["data"]["count"] == 3
    assert missed[0]["data"]["scheduled_for"] == [
        "2026-03-02T02:00:00Z", "2026-03-02T03:00:00Z", "2026-03-02T04:00:00Z"]
    assert scheduling.get(bot, added.id).missed == 3


def test_the_latest_coalesced_time_past_the_grace_is_missed_too(bot: Service, clock: Clock) -> None:
    scheduling.add(bot, "demo", {"node": "gpu01"}, "alice", cron="0 * * * *")
    with running(bot):
        pass
    clock.move_to(datetime(2026, 3, 2, 4, 30, tzinfo=UTC))
    with running(bot):
        pass
    assert executions_of(bot) == []
    total = sum(e["data"]["count"] for e in events(bot, "schedule_missed"))
    assert total == 3  # 02:00 and 03:00 coalesced, 04:00 past the grace


# --- approvals ----------------------------------------------------------------------------


def test_approved_ahead_runs_approved_with_the_approvers_recorded(bot: Service,
                                                                   clock: Clock) -> None:
    added = scheduling.add(bot, "maint", {"node": "gpu01"}, "carol", at="2026-03-02 01:30",
                           approve="ahead")
    with pytest.raises(Refused, match="carol added the schedule and may not approve it too"):
        scheduling.approve(bot, added.id, "carol")
    with pytest.raises(Refused, match="bob may not approve maint"):
        scheduling.approve(bot, added.id, "bob")
    _, names, note = scheduling.approve(bot, added.id, "dave")
    assert names == ["dave"] and note == ""
    with pytest.raises(Refused, match="already approved"):
        scheduling.approve(bot, added.id, "dave")
    clock.move_to(T0 + timedelta(minutes=31))
    with running(bot):
        pass
    (ex,) = executions_of(bot, "maint")
    assert ex.state == "approved"
    approved = [e for e in events(bot, "approved") if e["execution_id"] == ex.id]
    assert [(e["actor"], e["data"]["ahead"]) for e in approved] == [("dave", "schedule 1")]
    engine = Engine(bot, sleep=lambda s: None)
    try:
        assert engine.drive(ex.id).state == "succeeded"
    finally:
        engine.close()
    started = [e for e in events(bot, "started") if e["execution_id"] == ex.id]
    assert started[0]["data"]["approved_by"] == ["dave"]


def test_a_changed_plan_does_not_run_unattended(bot: Service, clock: Clock) -> None:
    added = scheduling.add(bot, "maint", {"node": "gpu01"}, "alice", at="2026-03-02 01:30",
                           approve="ahead")
    scheduling.approve(bot, added.id, "carol")
    folder = Path(bot.config.runbook_paths[0])  # the runbook changes before the fire time
    changed = medium(version="1.1.0")
    changed["steps"][0]["with"]["key"] = "{{ node }}-changed"
    (folder / "maint.yaml").write_text(yaml.safe_dump(changed, sort_keys=False))
    bot._runbooks = None
    clock.move_to(T0 + timedelta(minutes=31))
    with running(bot):
        pass
    (ex,) = executions_of(bot, "maint")
    assert ex.state == "awaiting_approval"
    assert ex.requested_by == "alice"
    voided = [e for e in events(bot, "preapproval_voided") if e["execution_id"] == ex.id]
    assert voided and voided[0]["data"]["approved_plan_hash"] == added.plan_hash
    assert "no longer matches" in voided[0]["data"]["why"]
    assert bot.approvals(ex.id) == []
    engine = Engine(bot, sleep=lambda s: None)
    try:
        assert engine.drive(ex.id, wait_for_approval=False).state == "awaiting_approval"
    finally:
        engine.close()
    assert fakes.JOURNAL == []


def test_without_approvals_ahead_the_run_asks_when_it_fires(bot: Service, clock: Clock) -> None:
    scheduling.add(bot, "maint", {"node": "gpu01"}, "alice", at="2026-03-02 01:30")
    clock.move_to(T0 + timedelta(minutes=31))
    with running(bot):
        pass
    (ex,) = executions_of(bot, "maint")
    assert ex.state == "awaiting_approval"
    assert bot.approve(ex.id, "carol").state == "approved"


def test_approving_ahead_binds_to_the_plan_of_now(bot: Service, clock: Clock) -> None:
    added = scheduling.add(bot, "maint", {"node": "gpu01"}, "alice", cron="0 2 * * *",
                           approve="ahead")
    scheduling.approve(bot, added.id, "carol")
    folder = Path(bot.config.runbook_paths[0])
    changed = medium(version="1.1.0", summary="changed")
    (folder / "maint.yaml").write_text(yaml.safe_dump(changed, sort_keys=False))
    bot._runbooks = None
    found, names, note = scheduling.approve(bot, added.id, "dave")
    assert "plan changed" in note and names == ["dave"]
    assert found.plan_hash != added.plan_hash
    clock.move_to(T0 + timedelta(hours=1, seconds=5))
    with running(bot):
        pass
    (ex,) = executions_of(bot, "maint")
    assert ex.state == "approved" and bot.approvals(ex.id) == ["dave"]


# --- refusals --------------------------------------------------------------------------


@pytest.mark.parametrize("runbook_name, params, timing, message", [
    ("demo", {"node": "gpu01"}, {"cron": "0 2 * *"}, "a crontab has 5 fields"),
    ("demo", {"node": "gpu01"}, {"cron": "61 2 * * *"}, 'cron "61 2 * * *"'),
    ("demo", {"node": "gpu01"}, {"cron": "0 2 1 * MON"}, "not both"),
    ("demo", {"node": "gpu01"}, {"cron": "0 2 * * 9"}, "0 and 7 are Sunday"),
    ("dmeo", {"node": "gpu01"}, {"cron": "0 2 * * *"}, 'did you mean "demo"'),
    ("demo", {"node": "gpu99"}, {"cron": "0 2 * * *"}, "not a known node"),
    ("demo", {"nod": "gpu01"}, {"cron": "0 2 * * *"}, 'unknown parameter "nod"'),
    ("demo", {"node": "gpu01"}, {"cron": "0 2 * * *", "tz": "Mars/Olympus"},
     'unknown time zone "Mars/Olympus"'),
    ("demo", {"node": "gpu01"}, {"at": "2026-03-01 02:00"}, "is in the past"),
    ("demo", {"node": "gpu01"}, {"at": "next tuesday"}, "is not a time"),
    ("demo", {"node": "gpu01"}, {}, "give either cron="),
    ("demo", {"node": "gpu01"}, {"cron": "0 2 * * *", "at": "2026-12-05 02:00"},
     "give either cron="),
    ("demo", {"node": "gpu01"}, {"cron": "0 2 * * *", "approve": "maybe"}, "approve=ahead"),
])
def test_bad_input_is_refused_and_nothing_is_stored(
        bot: Service, clock: Clock, runbook_name: str, params: dict[str, str],
        timing: dict[str, str], message: str) -> None:
    with pytest.raises(Refused, match=re.escape(message)):
        scheduling.add(bot, runbook_name, params, "alice", **timing)
    assert count(bot, schedules) == 0
    with running(bot) as runner:
        assert runner.jobs() == {}
    (refused,) = events(bot, "schedule_refused")
    assert message in refused["data"]["reason"]


def test_only_requesters_may_schedule(bot: Service, clock: Clock) -> None:
    with pytest.raises(Refused, match="eve may not request runbooks"):
        scheduling.add(bot, "demo", {"node": "gpu01"}, "eve", cron="0 2 * * *")
    assert count(bot, schedules) == 0


@pytest.mark.parametrize("expr, expected", [
    ("0 2 * * 0", datetime(2026, 3, 8, 2, 0, tzinfo=UTC)),  # crontab: 0 is Sunday
    ("0 2 * * 7", datetime(2026, 3, 8, 2, 0, tzinfo=UTC)),
    ("0 2 * * 1-5", datetime(2026, 3, 2, 2, 0, tzinfo=UTC)),  # T0 is a Monday, 01:00
    ("0 2 * * SAT", datetime(2026, 3, 7, 2, 0, tzinfo=UTC)),
    ("0 2 * * */3", datetime(2026, 3, 4, 2, 0, tzinfo=UTC)),  # sun, wed, sat
])
def test_weekdays_are_read_as_crontab_reads_them(bot: Service, clock: Clock, expr: str,
                                                 expected: datetime) -> None:
    added = scheduling.add(bot, "demo", {"node": "gpu01"}, "alice", cron=expr, tz="UTC")
    assert scheduling.next_fire(added) == expected


def test_a_time_zone_moves_the_fire_time(bot: Service, clock: Clock) -> None:
    added = scheduling.add(bot, "demo", {"node": "gpu01"}, "alice", cron="0 2 * * SAT",
                           tz="Europe/Istanbul")  # UTC+3
    assert scheduling.next_fire(added) == datetime(2026, 3, 6, 23, 0, tzinfo=UTC)
    at = scheduling.add(bot, "demo", {"node": "gpu02"}, "alice", at="2026-12-05 02:00",
                        tz="Europe/Istanbul")
    assert at.at == "2026-12-04T23:00:00Z"


# --- pause, resume, remove; the configuration's schedules; the leader ---------------------


def test_pause_resume_and_remove(bot: Service, clock: Clock) -> None:
    added = scheduling.add(bot, "demo", {"node": "gpu01"}, "alice", cron="30 * * * *")
    job = f"schedule:{added.id}:1"
    with pytest.raises(Refused, match="bob may not pause schedule"):
        scheduling.steer(bot, added.id, "bob", "pause")
    with running(bot) as runner:
        scheduling.steer(bot, added.id, "alice", "pause")
        runner.tick()
        assert runner.jobs() == {job: None}
        clock.move_to(T0 + timedelta(minutes=31))
        runner.settle()
        assert executions_of(bot) == []
        scheduling.steer(bot, added.id, "carol", "resume")  # an approver of the runbook
        runner.tick()
        assert runner.jobs() == {job: datetime(2026, 3, 2, 2, 30, tzinfo=UTC)}
        runner.settle()
        assert executions_of(bot) == []  # paused over 01:30: not run afterwards
        scheduling.steer(bot, added.id, "alice", "remove")
        runner.tick()
        assert runner.jobs() == {}
    with pytest.raises(Refused, match="is removed"):
        scheduling.steer(bot, added.id, "alice", "resume")
    assert [e["kind"] for e in events(bot, "schedule_paused")] == ["schedule_paused"]


def test_scheduling_from_the_configuration(make_bot: BotFactory, clock: Clock) -> None:
    entry = {"name": "weekly", "runbook": "demo", "params": {"node": "gpu03"},
             "cron": "0 8 * * MON", "tz": "UTC", "requested_by": "bot"}
    bot = make_bot({"demo": runbook([record("a", "{{ node }}")])}, schedules=[entry])
    with running(bot) as runner:
        (found,) = scheduling.listing(bot)
        assert (found.source, found.config_name, found.created_by) == ("config", "weekly",
                                                                       "bot")
        assert runner.jobs() == {f"schedule:{found.id}:1": datetime(2026, 3, 2, 8, 0,
                                                                      tzinfo=UTC)}
        clock.move_to(datetime(2026, 3, 2, 8, 0, 3, tzinfo=UTC))
        runner.settle()
    (ex,) = executions_of(bot)
    assert ex.requested_by == "bot"  # not a configured requester: the configuration asks
    with pytest.raises(Refused, match="comes from the configuration"):
        scheduling.steer(bot, found.id, "carol", "remove")
    changed = bot.config.model_copy(update={"schedules": [
        bot.config.schedules[0].model_copy(update={"cron": "0 9 * * MON"})]})
    bot.config = changed
    with running(bot) as runner:
        again = scheduling.get(bot, found.id)
        assert again.revision == 2 and again.cron == "0 9 * * MON"
        assert list(runner.jobs()) == [f"schedule:{found.id}:2"]
    bot.config = changed.model_copy(update={"schedules": []})
    with running(bot) as runner:
        assert scheduling.get(bot, found.id).state == scheduling.REMOVED
        assert runner.jobs() == {}


def test_a_wrong_configured_schedule_is_reported_and_left_out(make_bot: BotFactory,
                                                             clock: Clock) -> None:
    entry = {"name": "broken", "runbook": "demo", "params": {"node": "gpu42"},
             "cron": "0 8 * * MON"}
    bot = make_bot({"demo": runbook([record("a", "{{ node }}")])}, schedules=[entry])
    lines: list[str] = []
    runner = Scheduler(bot, lines.append)
    runner.start()
    runner.stop()
    assert any("broken" in line and "not a known node" in line for line in lines)
    assert count(bot, schedules) == 0


def test_the_scheduler_is_a_leader_only_task_that_stops(bot: Service) -> None:
    import threading

    task = scheduler_task(bot)
    assert (task.name, task.leader_only) == ("scheduler", True)
    stop = threading.Event()
    thread = threading.Thread(target=task.run, args=(stop,))
    thread.start()
    stop.set()
    thread.join(30)
    assert not thread.is_alive()


def test_a_paused_schedule_that_fires_anyway_is_skipped(bot: Service, clock: Clock) -> None:
    """The leader notices a pause at its next poll; a fire in between is skipped."""
    added = scheduling.add(bot, "demo", {"node": "gpu01"}, "alice", cron="30 * * * *")
    scheduling.steer(bot, added.id, "alice", "pause")
    clock.move_to(T0 + timedelta(minutes=31))
    assert scheduling.fire(bot, added.id).outcome == "skipped"
    assert executions_of(bot) == []


def test_a_refused_run_is_recorded_once(bot: Service, clock: Clock) -> None:
    added = scheduling.add(bot, "demo", {"node": "gpu01"}, "alice", at="2026-03-02 01:30")
    with bot.db.begin() as conn:  # alice is no longer a requester by then
        conn.execute(update(schedules).values(created_by="eve"))
    clock.move_to(T0 + timedelta(minutes=31))
    with running(bot):
        pass
    found = scheduling.get(bot, added.id)
    assert found.last_outcome is not None and found.last_outcome.startswith("refused: eve")
    assert executions_of(bot) == []
    assert scheduling.fire(bot, added.id).outcome in ("duplicate", "skipped")


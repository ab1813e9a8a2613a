"""Schedules: a runbook requested at a time (``at``) or on a crontab (``cron``).

The database is the truth: these functions only write the ``schedules`` table (and a fire
time's ``scheduled_runs`` row); they never fire by themselves: the leader's scheduler
(bot.schedule.scheduler) calls ``fire`` and ``missed``. Every run is an ordinary request.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy import Connection, select, update
from sqlalchemy.exc import IntegrityError

from bot.config import ScheduleConfig
from bot.execution.approval import approval_problem, may_steer, unapprovable
from bot.execution.planning import approval_policy
from bot.runbooks import secrets
from bot.schedule import ahead
from bot.service import Preapproval, Service
from bot.store import audit
from bot.store.db import now_iso
from bot.store.schema import scheduled_runs, schedules
from bot.store.words import Kind
from kit.canonical import canonical
from kit.durations import parse_duration
from kit.errors import Refused

ACTIVE, PAUSED, REMOVED, DONE, MISSED = "active", "paused", "removed", "done", "missed"
LIVE = (ACTIVE, PAUSED)
APPROVE_MODES = ("ahead", "when_due")
OWN_KEYS = ("cron", "at", "tz", "approve")  # schedule add's own keys; the rest are params
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat", "sun")
MAX_COALESCED = 10_000  # fire times looked at when counting coalesced misses


@dataclass(frozen=True)
class Schedule:
    id: int
    runbook: str
    params: dict[str, str]
    cron: str | None
    at: str | None  # UTC ISO
    timezone: str
    approve: str
    plan_hash: str
    created_by: str
    created_at: str
    source: str
    config_name: str | None
    state: str
    revision: int
    last_handled: str | None
    last_outcome: str | None
    last_execution_id: int | None
    missed: int
    updated_at: str

    @property
    def subject(self) -> str:
        return f"schedule:{self.id}"

    @property
    def when(self) -> str:
        if self.cron:
            return f'cron "{self.cron}" {self.timezone}'
        assert self.at is not None
        local = parse_utc(self.at).astimezone(zone(self.timezone))
        return f"at {local:%Y-%m-%d %H:%M} {self.timezone}"

    def trigger(self) -> Any:
        return make_trigger(self.cron, self.at, self.timezone)


# --- time -----------------------------------------------------------------------------


def utc_iso(moment: datetime) -> str:
    """A fire time as text: UTC, whole seconds (the key of a scheduled run)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_utc(text: str) -> datetime:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def now_utc() -> datetime:
    return datetime.now(UTC)


def zone(name: str) -> ZoneInfo:
    """The time zone called ``name`` (IANA, like Europe/Istanbul), or Refused."""
    if not re.fullmatch(r"[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+){0,2}", name or ""):
        raise Refused(f'"{name[:60]}" is not a time zone name like UTC or Europe/Istanbul')
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise Refused(f'unknown time zone "{name}": use an IANA name like UTC, Europe/Istanbul '
                      "or America/New_York") from None


def parse_at(text: str, tz: ZoneInfo, what: str = "at") -> datetime:
    """``2026-12-05 02:00`` (in ``tz`` unless it names an offset) as an aware datetime."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise Refused(f'{what}="{text[:40]}" is not a time: write it like "2026-12-05 02:00"') \
            from None
    return moment.replace(tzinfo=tz) if moment.tzinfo is None else moment


def weekdays(field: str) -> str:
    """A crontab day-of-week field in APScheduler's words: crontab counts 0 (and 7) as
    Sunday, APScheduler 3 counts 0 as Monday, so numbers are turned into day names."""
    out: list[str] = []
    for part in field.lower().split(","):
        base, slash, step_text = part.partition("/")
        numeric = any(c.isdigit() for c in base) or (base == "*" and slash)
        if not numeric:
            out.append(part)
            continue
        try:
            step = int(step_text) if slash else 1
            if base == "*":
                low, high = 0, 6
            elif "-" in base:
                low, high = (int(x) for x in base.split("-", 1))
            else:
                low = int(base)
                high = 6 if slash else low
        except ValueError:
            raise ValueError(f'day of week "{part}": use 0-7 (0 and 7 are Sunday) or names '
                             "like MON-FRI") from None
        if not (0 <= low <= 7 and 0 <= high <= 7 and low <= high and step >= 1):
            raise ValueError(f'day of week "{part}": use 0-7 (0 and 7 are Sunday)')
        out.extend(_DAYS[day] for day in range(low, high + 1, step))
    return ",".join(dict.fromkeys(out))


def cron_trigger(expr: str, tz: ZoneInfo) -> Any:
    from apscheduler.triggers.cron import CronTrigger

    fields = expr.split()
    if len(fields) != 5:
        raise Refused(f'cron "{expr[:80]}": a crontab has 5 fields (minute hour day-of-month '
                      f'month day-of-week), like "0 2 * * SAT"; this has {len(fields)}')
    minute, hour, day, month, dow = fields
    if day not in ("*", "?") and dow not in ("*", "?"):
        raise Refused(f'cron "{expr}": give a day of the month or a day of the week, not both '
                      "(crontab would run on either, APScheduler only on both)")
    try:
        return CronTrigger(minute=minute, hour=hour, day=day.replace("?", "*"), month=month,
                           day_of_week=weekdays(dow.replace("?", "*")), timezone=tz)
    except ValueError as exc:
        raise Refused(f'cron "{expr[:80]}": {exc}') from None


def make_trigger(cron: str | None, at: str | None, tz_name: str) -> Any:
    from apscheduler.triggers.date import DateTrigger

    tz = zone(tz_name)
    if cron:
        return cron_trigger(cron, tz)
    assert at is not None
    return DateTrigger(run_date=parse_utc(at), timezone=UTC)


def fire_times(trigger: Any, after: datetime, until: datetime,
               limit: int = MAX_COALESCED) -> list[datetime]:
    """The trigger's fire times in (after, until]."""
    found: list[datetime] = []
    previous: datetime | None = None
    probe = after + timedelta(microseconds=1)
    while len(found) < limit:
        moment = trigger.get_next_fire_time(previous, probe)
        if moment is None or moment > until:
            break
        if moment > after:
            found.append(moment.astimezone(UTC))
        previous = moment
        probe = moment + timedelta(microseconds=1)
    return found


def next_fire(schedule: Schedule, now: datetime | None = None) -> datetime | None:
    """When it fires next (None: paused, ended, or a one-time schedule that has fired)."""
    if schedule.state != ACTIVE:
        return None
    if schedule.at:
        return None if schedule.last_handled else parse_utc(schedule.at)
    moment = now or now_utc()
    if schedule.last_handled:
        moment = max(moment, parse_utc(schedule.last_handled) + timedelta(microseconds=1))
    found = schedule.trigger().get_next_fire_time(None, moment)
    return found.astimezone(UTC) if found else None


def grace_seconds(service: Service) -> float:
    return parse_duration(service.config.scheduling.misfire_grace)


# --- reading ------------------------------------------------------------------------


def _from_row(row: Any) -> Schedule:
    data = dict(row._mapping)
    data["params"] = json.loads(data["params"])
    return Schedule(**data)


def get(service: Service, schedule_id: int) -> Schedule:
    with service.db.connect() as conn:
        return _get(conn, schedule_id)


def _get(conn: Connection, schedule_id: int) -> Schedule:
    row = conn.execute(select(schedules).where(schedules.c.id == schedule_id)).first()
    if row is None:
        raise Refused(f"there is no schedule {schedule_id}")
    return _from_row(row)


def listing(service: Service, *, everything: bool = False) -> list[Schedule]:
    query = select(schedules).order_by(schedules.c.id)
    if not everything:
        query = query.where(schedules.c.state.in_([*LIVE, MISSED]))
    with service.db.connect() as conn:
        return [_from_row(row) for row in conn.execute(query)]


def approvers_ahead(service: Service, schedule: Schedule) -> list[str]:
    with service.db.connect() as conn:
        return ahead.approvers(conn, schedule.subject, schedule.plan_hash)


# --- changes ------------------------------------------------------------------------


def add(service: Service, runbook: str, raw: Mapping[str, str], user: str, *,
        cron: str | None = None,
        at: str | None = None, tz: str | None = None, approve: str = "when_due",
        source: str = "cli") -> Schedule:
    """Check and store a schedule; Refused (and nothing stored) when anything is wrong.

        schedule add NAME key=value... cron="0 2 * * SAT" [tz=Europe/Istanbul] [approve=ahead]
        schedule add NAME key=value... at="2026-12-05 02:00" [tz=...] [approve=ahead]

    Checked: the runbook exists, the parameters are valid and the plan is made (its hash
    kept), the crontab or the time reads, the time zone exists and the schedule fires at
    least once more. Anything wrong is refused with what to fix.
    """
    try:
        return _add(service, runbook, raw, user, cron, at, tz, approve, source)
    except Refused as exc:
        shown = secrets.scrub_raw(service.known(runbook), raw)  # before the write: it may load
        with service.db.begin() as conn:
            audit.append(conn, Kind.SCHEDULE_REFUSED, user, {
                "runbook": runbook[:64],
                "params": {k[:41]: str(v)[:200] for k, v in shown.items()},
                "cron": cron, "at": at, "tz": tz, "approve": approve, "source": source,
                "reason": str(exc)[:2000]})
        raise


def _add(service: Service, runbook: str, raw: Mapping[str, str], user: str, cron: str | None,
         at: str | None, tz: str | None, approve: str, source: str) -> Schedule:
    if not service.config.matches(user, service.config.requesters, requesting=True):
        raise Refused(f"{user} may not request runbooks, so may not schedule them either "
                      f"(requesters: {', '.join(service.config.requesters)})")
    at_utc, tz_name, approve = check_timing(service, cron, at, tz, approve)
    if runbook in ("open-window", "close-window"):
        raise Refused(f"{runbook} is run by maintenance windows: use `window create`")
    plan = service.plan(runbook, raw)
    if plan.sealed:  # its parameters are kept in the schedule's row until it fires
        raise Refused(f"{runbook}: a schedule cannot keep a secret parameter "
                      f"({', '.join(sorted(plan.sealed))}); request the runbook when it is due")
    problem = unapprovable(plan.approval, runbook, user)
    if problem is not None:  # every run it fires would be refused
        raise Refused(problem)
    now = now_iso()
    with service.db.begin() as conn:
        schedule_id = _insert(conn, runbook=runbook, params=canonical(dict(raw)),
                              cron=cron, at=at_utc, timezone=tz_name, approve=approve,
                              plan_hash=plan.hash, created_by=user, created_at=now,
                              source=source, updated_at=now)
        schedule = _get(conn, schedule_id)
        audit.append(conn, Kind.SCHEDULE_ADDED, user, _describe(schedule))
    return schedule


def check_timing(service: Service, cron: str | None, at: str | None, tz: str | None,
                 approve: str) -> tuple[str | None, str, str]:
    """(at in UTC, time zone name, approve mode), or Refused saying what is wrong."""
    approve = approve.replace("-", "_")
    if approve not in APPROVE_MODES:
        raise Refused(f'approve="{approve[:20]}": say approve=ahead (approvers approve the '
                      "schedule beforehand) or leave it out (they are asked when it fires)")
    if bool(cron) == bool(at):
        raise Refused('give either cron="MIN HOUR DAY MONTH WEEKDAY" (like "0 2 * * SAT") or '
                      'at="YYYY-MM-DD HH:MM"')
    tz_name = tz or service.config.scheduling.timezone
    tz_info = zone(tz_name)
    now = now_utc()
    if cron:
        trigger = cron_trigger(cron, tz_info)
        if trigger.get_next_fire_time(None, now) is None:
            raise Refused(f'cron "{cron}" never fires')
        return None, tz_name, approve
    assert at is not None
    moment = parse_at(at, tz_info)
    if moment <= now:
        raise Refused(f'at="{at}" ({tz_name}) is in the past: it is now '
                      f"{now.astimezone(tz_info):%Y-%m-%d %H:%M} there")
    return utc_iso(moment), tz_name, approve


def _insert(conn: Connection, **values: Any) -> int:
    result = conn.execute(schedules.insert().values(state=ACTIVE, revision=1, missed=0,
                                                    **values))
    key = result.inserted_primary_key
    assert key is not None
    return int(key[0])


def _describe(schedule: Schedule) -> dict[str, Any]:
    return {"schedule": schedule.id, "runbook": schedule.runbook, "params": schedule.params,
            "cron": schedule.cron, "at": schedule.at, "tz": schedule.timezone,
            "approve": schedule.approve, "plan_hash": schedule.plan_hash,
            "requested_by": schedule.created_by, "source": schedule.source,
            "config_name": schedule.config_name}


def _may_steer(service: Service, schedule: Schedule, user: str) -> bool:
    """Pause, resume, remove: who added it, or an approver of its runbook (of the site
    when the runbook is gone)."""
    try:
        runbook = service.runbook(schedule.runbook).runbook
        approvers = approval_policy(runbook, service.config).approvers
    except Refused:
        approvers = list(service.config.approvers)
    return may_steer(service.config, user, schedule.created_by, approvers)


def _set(conn: Connection, schedule_id: int, **fields: Any) -> None:
    conn.execute(update(schedules).where(schedules.c.id == schedule_id)
                 .values(updated_at=now_iso(), **fields))


def steer(service: Service, schedule_id: int, user: str, verb: str) -> Schedule:
    """``pause``, ``resume`` or ``remove`` a schedule."""
    goal = {"pause": (ACTIVE, PAUSED), "resume": (PAUSED, ACTIVE),
            "remove": (None, REMOVED)}[verb]
    with service.db.begin() as conn:
        schedule = _get(conn, schedule_id)
        if not _may_steer(service, schedule, user):
            raise Refused(f"{user} may not {verb} schedule {schedule.id}: only who added it "
                          f"({schedule.created_by}) or an approver of {schedule.runbook} may")
        if verb == "remove" and schedule.config_name:
            raise Refused(f"schedule {schedule.id} comes from the configuration "
                          f"(schedules: {schedule.config_name}): remove it there, or pause it")
        wanted_from, to = goal
        if schedule.state not in LIVE or (wanted_from and schedule.state != wanted_from):
            raise Refused(f"schedule {schedule.id} is {schedule.state}: cannot {verb} it")
        _set(conn, schedule.id, state=to)
        kind = {"pause": Kind.SCHEDULE_PAUSED, "resume": Kind.SCHEDULE_RESUMED,
                "remove": Kind.SCHEDULE_REMOVED}[verb]
        audit.append(conn, kind, user,
                     {"schedule": schedule.id, "runbook": schedule.runbook, "state": to})
        return _get(conn, schedule.id)


def approve(service: Service, schedule_id: int, user: str) -> tuple[Schedule, list[str], str]:
    """Approve a schedule ahead, bound to the plan as it is now.

    Returns the schedule, its approvers ahead and a note (when the plan changed since it
    was added, the approval is for the new plan and earlier ones no longer count)."""
    schedule = get(service, schedule_id)
    if schedule.state not in LIVE:
        raise Refused(f"schedule {schedule.id} is {schedule.state}: nothing to approve")
    if schedule.approve != "ahead":
        raise Refused(f"schedule {schedule.id} asks its approvers when it fires "
                      "(added without approve=ahead): there is nothing to approve ahead")
    plan = service.plan(schedule.runbook, schedule.params)
    if plan.approval.required == 0:
        raise Refused(f"{schedule.runbook} needs no approval")
    problem = approval_problem(service.config, plan.approval, plan.runbook, user,
                               schedule.created_by,
                                   asked="added the schedule")
    note = ""
    with service.db.begin() as conn:
        if problem is not None:
            audit.append(conn, Kind.APPROVAL_REFUSED, user, {"reason": problem,
                                                             "subject": schedule.subject})
        else:
            if plan.hash != schedule.plan_hash:
                note = (f"the plan changed since the schedule was added (now {plan.hash[:12]}): "
                        "this approval is for the plan as it is now; earlier ones no longer "
                        "count")
                _set(conn, schedule.id, plan_hash=plan.hash)
            if not ahead.record(conn, schedule.subject, user, plan.hash):
                problem = f"{user} has already approved schedule {schedule.id}"
            else:
                names = ahead.approvers(conn, schedule.subject, plan.hash)
                audit.append(conn, Kind.SCHEDULE_APPROVED, user, {
                    "schedule": schedule.id, "runbook": schedule.runbook,
                    "plan_hash": plan.hash, "approvals": len(names),
                    "required": plan.approval.required})
                return _get(conn, schedule.id), names, note
    raise Refused(problem)


# --- the configuration's schedules ------------------------------------------------------


def sync_config(service: Service) -> list[str]:
    """Bring the configuration's ``schedules:`` into the table (by name); returns problems.

    A changed entry gets a new revision (the scheduler replaces its job); an entry gone
    from the configuration is removed. A wrong entry is reported and left out."""
    problems: list[str] = []
    wanted: dict[str, ScheduleConfig] = {}
    for entry in service.config.schedules:
        if entry.name in wanted:
            problems.append(f"schedules: {entry.name} is declared twice")
            continue
        wanted[entry.name] = entry
    with service.db.connect() as conn:
        rows = {row.config_name: _from_row(row) for row in conn.execute(
            select(schedules).where(schedules.c.config_name.is_not(None)))}
    for name, entry in wanted.items():
        try:
            _sync_entry(service, entry, rows.get(name))
        except Refused as exc:
            problems.append(f"schedules: {name}: {exc}")
            with service.db.begin() as conn:
                audit.append(conn, Kind.SCHEDULE_REFUSED, "config", {
                    "config_name": name, "runbook": entry.runbook, "reason": str(exc)[:2000]})
    for name, schedule in rows.items():
        if name not in wanted and schedule.state in LIVE:
            with service.db.begin() as conn:
                _set(conn, schedule.id, state=REMOVED)
                audit.append(conn, Kind.SCHEDULE_REMOVED, "config", {
                    "schedule": schedule.id, "config_name": name,
                    "why": "no longer in the configuration"})
    return problems


def _sync_entry(service: Service, entry: ScheduleConfig, existing: Schedule | None) -> None:
    raw = {k: _text(v) for k, v in entry.params.items()}
    tz_name = entry.tz or service.config.scheduling.timezone
    approve_mode: str = entry.approve
    if existing is not None and existing.state not in (REMOVED,) and (
            existing.runbook, existing.params, existing.cron, existing.timezone,
            existing.approve, existing.created_by) == (
            entry.runbook, raw, entry.cron, tz_name, approve_mode, entry.requested_by) and (
            entry.at is None or existing.at == utc_iso(parse_at(entry.at, zone(tz_name)))):
        return
    at_utc, tz_name, approve_mode = check_timing(service, entry.cron, entry.at, tz_name,
                                                 approve_mode)
    plan = service.plan(entry.runbook, raw)
    now = now_iso()
    values = {"runbook": entry.runbook, "params": canonical(raw), "cron": entry.cron,
              "at": at_utc, "timezone": tz_name, "approve": approve_mode,
              "plan_hash": plan.hash, "created_by": entry.requested_by, "updated_at": now}
    with service.db.begin() as conn:
        if existing is None:
            schedule_id = _insert(conn, created_at=now, source="config",
                                  config_name=entry.name, **values)
            audit.append(conn, Kind.SCHEDULE_ADDED, "config", _describe(_get(conn, schedule_id)))
        else:
            conn.execute(update(schedules).where(schedules.c.id == existing.id).values(
                state=ACTIVE, revision=existing.revision + 1, last_handled=None,
                created_at=now, **values))
            audit.append(conn, Kind.SCHEDULE_CHANGED, "config", _describe(_get(conn, existing.id)))


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# --- firing (the leader's scheduler calls these) -----------------------------------------


@dataclass(frozen=True)
class FireOutcome:
    outcome: str  # requested, refused, missed, skipped, duplicate
    execution_id: int | None = None
    detail: str = ""


def run_exists(conn: Connection, subject: str, scheduled_for: str) -> bool:
    """Whether this fire time (or window transition) of ``subject`` was already handled."""
    return conn.execute(select(scheduled_runs.c.outcome).where(
        scheduled_runs.c.subject == subject,
        scheduled_runs.c.scheduled_for == scheduled_for)).first() is not None


def record_run(conn: Connection, subject: str, scheduled_for: str, outcome: str,
               execution_id: int | None = None, detail: str | None = None) -> None:
    conn.execute(scheduled_runs.insert().values(
        subject=subject, scheduled_for=scheduled_for, outcome=outcome,
        execution_id=execution_id, detail=detail, at=now_iso()))


def _due(schedule: Schedule, now: datetime) -> tuple[datetime | None, list[datetime]]:
    """The fire time this run stands for (the latest not later than now, not yet dealt
    with) and the earlier ones it coalesces."""
    trigger = schedule.trigger()
    after = parse_utc(schedule.last_handled or schedule.created_at)  # fire times after it
    times = fire_times(trigger, after, now)
    if not times:
        return None, []
    return times[-1], times[:-1]


def fire(service: Service, schedule_id: int, now: datetime | None = None) -> FireOutcome:
    """Request the schedule's run for its latest fire time; at most once per fire time.

    The run is an ordinary request (``Service.request``) whose requester is the person who
    added the schedule, with source "schedule". With ``approve=ahead`` (approvers approved
    the schedule beforehand, ``schedule approve ID``, bound to the plan hash) the runbook is
    planned again: the same hash and enough acceptable approvers make the execution approved
    at once (the approvers are in its audit log); anything else leaves a normal request
    waiting for approval, with an audit event saying why the approvals ahead did not apply.
    Otherwise (``when_due``) the run is a request awaiting approval (chat surfaces post it),
    unless its runbook needs none. The fire time's ``scheduled_runs`` row is written in the
    same transaction as its execution, so a second fire of the same time (a restart between
    running a job and APScheduler saving its next time, or two schedulers) is ignored.
    """
    moment = now or now_utc()
    try:
        schedule = get(service, schedule_id)
    except Refused:
        return FireOutcome("skipped", detail=f"schedule {schedule_id} no longer exists")
    if schedule.state != ACTIVE:
        return FireOutcome("skipped", detail=f"schedule {schedule.id} is {schedule.state}")
    due, coalesced = _due(schedule, moment)
    if due is None:
        return FireOutcome("duplicate", detail="no fire time left to deal with")
    key = utc_iso(due)
    with service.db.connect() as conn:
        if run_exists(conn, schedule.subject, key):
            return FireOutcome("duplicate", detail=f"{key} was already dealt with")
        names = ahead.approvers(conn, schedule.subject, schedule.plan_hash)
    if coalesced:
        _report_coalesced(service, schedule, coalesced, due)
    preapproved = (Preapproval(schedule.plan_hash, tuple(names), f"schedule {schedule.id}")
                   if schedule.approve == "ahead" else None)
    ended = {"state": DONE} if schedule.at else {}  # a one-time schedule has had its time

    def also(conn: Connection, execution_id: int) -> None:
        record_run(conn, schedule.subject, key, "requested", execution_id)
        _set(conn, schedule.id, last_handled=key, last_execution_id=execution_id,
             last_outcome=f"requested execution {execution_id}", **ended)
        audit.append(conn, Kind.SCHEDULE_FIRED, "scheduler", {
            "schedule": schedule.id, "runbook": schedule.runbook, "scheduled_for": key,
            "late_by_seconds": round((moment - due).total_seconds(), 3),
            "requested_by": schedule.created_by, "approve": schedule.approve,
            "approvers_ahead": names}, execution_id)

    try:
        execution_id = service.request(schedule.runbook, schedule.params, schedule.created_by,
                                   source="schedule", configured=schedule.source == "config",
                                   preapproved=preapproved, also=also)
    except IntegrityError:
        return FireOutcome("duplicate", detail=f"{key} was dealt with at the same time")
    except Refused as exc:
        with service.db.begin() as conn:
            if run_exists(conn, schedule.subject, key):
                return FireOutcome("duplicate", detail=f"{key} was already dealt with")
            record_run(conn, schedule.subject, key, "refused", None, str(exc)[:2000])
            _set(conn, schedule.id, last_handled=key, last_execution_id=None,
                 last_outcome=f"refused: {str(exc)[:500]}", **ended)
        return FireOutcome("refused", detail=str(exc))
    return FireOutcome("requested", execution_id)


def missed(service: Service, schedule_id: int, scheduled_for: datetime,
           now: datetime | None = None) -> FireOutcome:
    """A fire time later than the misfire grace: report it (never run it late)."""
    moment = now or now_utc()
    try:
        schedule = get(service, schedule_id)
    except Refused:
        return FireOutcome("skipped")
    key = utc_iso(scheduled_for)
    late = (moment - scheduled_for).total_seconds()
    _, coalesced = _due(schedule, scheduled_for)
    if coalesced:
        _report_coalesced(service, schedule, coalesced, scheduled_for)
    with service.db.begin() as conn:
        if run_exists(conn, schedule.subject, key):
            return FireOutcome("duplicate")
        why = (f"the bot was not running (or not the leader) at {key} and came back "
               f"{round(late)}s later, past the misfire grace of "
               f"{round(grace_seconds(service))}s: not run late")
        record_run(conn, schedule.subject, key, "missed", None, why)
        fresh = _get(conn, schedule.id)
        _set(conn, schedule.id, last_handled=key, missed=fresh.missed + 1,
             last_outcome=f"missed {key}: {why}",
             state=MISSED if schedule.at and fresh.state in LIVE else fresh.state)
        audit.append(conn, Kind.SCHEDULE_MISSED, "scheduler", {
            "schedule": schedule.id, "runbook": schedule.runbook, "scheduled_for": [key],
            "count": 1, "late_by_seconds": round(late, 3),
            "grace_seconds": grace_seconds(service), "why": why})
    return FireOutcome("missed", detail=why)


def _report_coalesced(service: Service, schedule: Schedule, times: Sequence[datetime],
                      instead: datetime) -> None:
    """Earlier fire times that one later run stands for (coalescing): reported, not run."""
    keys = [utc_iso(t) for t in times]
    with service.db.begin() as conn:
        fresh = _get(conn, schedule.id)
        _set(conn, schedule.id, missed=fresh.missed + len(keys))
        audit.append(conn, Kind.SCHEDULE_MISSED, "scheduler", {
            "schedule": schedule.id, "runbook": schedule.runbook, "scheduled_for": keys[:20],
            "count": len(keys), "coalesced_into": utc_iso(instead),
            "why": "fire times that passed while the bot was not running are coalesced: "
                   "only the latest is dealt with"})


# --- text for people --------------------------------------------------------------------

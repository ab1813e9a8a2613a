"""The leader's scheduler (``Scheduler``): APScheduler 3 over a SQLAlchemyJobStore in the
bot's own database, firing schedules and maintenance windows.

It only fires: the ``schedules`` and ``maintenance_windows`` tables say what and when, and
each fire goes through bot.schedule.scheduling or bot.schedule.windows.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from bot.schedule import scheduling, windows
from bot.service import Service
from bot.store import audit
from bot.store.words import Kind

if TYPE_CHECKING:
    pass

JOB_FUNCTION = "bot.schedule.scheduler:run_job"
JOB_TABLE = "apscheduler_jobs"
_log = logging.getLogger(__name__)
_RUNNERS: list[Scheduler] = []  # started and not stopped, last started last
_RUNNERS_LOCK = threading.Lock()


def log_line(line: str) -> None:
    _log.info("%s", line)


@dataclass(frozen=True)
class _Wanted:
    trigger: Any
    grace: int | None  # seconds; None: no limit (run however late)
    paused: bool
    first: datetime | None  # the first fire time to give APScheduler when adding the job
    name: str


class Scheduler:
    """One APScheduler (BackgroundScheduler) over the bot's database; ``start``, ``tick``
    (every poll), ``stop``.

    ``runbook serve`` runs it as the leader-only task "scheduler": it starts when the task
    starts and shuts down when the task is told to stop, so with several replicas only the
    leader fires. The ``schedules`` and ``maintenance_windows`` tables are the truth (any
    replica, the CLI and chat write them); every ``scheduling.poll_seconds`` the leader
    brings APScheduler's jobs in step with them, moves windows along and wakes APScheduler
    up. Restarts and failovers, on purpose (docs/schedules-and-windows.md):

    - the job store is persistent, so a fire time that passed while no leader ran is found
      when the next leader starts;
    - ``coalesce=True``: several passed fire times of one schedule give one run (the
      latest); the earlier ones are reported as missed (audit ``schedule_missed``,
      ``schedule list``);
    - ``misfire_grace_time`` (``scheduling.misfire_grace``, default 15 minutes): a fire
      time found later than that is not run late but reported as missed; a window's end
      has no grace (it always closes, however late);
    - a fire time is dealt with once: its ``scheduled_runs`` row is written with its
      execution, so a job run again after a crash (APScheduler saves a job's next time only
      after handing it to its executor) or by two schedulers at once requests nothing twice.
    """

    def __init__(self, service: Service, say: Callable[[str], None] = log_line) -> None:
        self.service = service
        self.say = say
        self.grace = max(1, round(scheduling.grace_seconds(service)))  # APScheduler wants an int
        self._scheduler: Any = None
        self._settled = threading.Condition()
        self._started = 0  # APScheduler's passes over its jobs: begun,
        self._passes = 0  # and ended
        self._submitted = 0  # jobs handed to the executor, and those that ended
        self._finished = 0

    # --- life cycle ---------------------------------------------------------------------

    def start(self) -> None:
        from apscheduler.events import (
            EVENT_JOB_ERROR,
            EVENT_JOB_EXECUTED,
            EVENT_JOB_MISSED,
            EVENT_JOB_SUBMITTED,
        )
        from apscheduler.executors.pool import ThreadPoolExecutor
        from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
        from apscheduler.schedulers.background import BackgroundScheduler
        from apscheduler.schedulers.base import STATE_STOPPED

        runner = self

        class _JobStore(SQLAlchemyJobStore):  # type: ignore[misc]
            def shutdown(self) -> None:
                """The engine is the bot's: leave it open."""

        class _Background(BackgroundScheduler):  # type: ignore[misc]
            def _process_jobs(self) -> Any:
                with runner._settled:
                    runner._started += 1
                try:
                    return super()._process_jobs()
                except Exception as exc:  # never let APScheduler's thread die of it
                    if self.state == STATE_STOPPED:
                        return None  # shut down in the middle of a pass
                    runner.say(f"scheduler pass failed ({type(exc).__name__}: {exc}); "
                               "trying again in 5s")
                    return 5.0
                finally:
                    with runner._settled:
                        runner._passes += 1
                        runner._settled.notify_all()

        self._scheduler = _Background(
            timezone=UTC,
            jobstores={"default": _JobStore(engine=self.service.db, tablename=JOB_TABLE)},
            executors={"default": ThreadPoolExecutor(4)},
            job_defaults={"coalesce": True, "misfire_grace_time": self.grace,
                          "max_instances": 1},
            daemon=True,
        )
        self._scheduler.add_listener(self._on_event, EVENT_JOB_SUBMITTED | EVENT_JOB_EXECUTED
                                     | EVENT_JOB_ERROR | EVENT_JOB_MISSED)
        with _RUNNERS_LOCK:
            _RUNNERS.append(self)
        self._scheduler.start(paused=True)  # the job store is open; nothing runs yet
        for problem in scheduling.sync_config(self.service):
            self.say(problem)
        self.sync()
        self._scheduler.resume()  # processes what is due at once

    def stop(self) -> None:
        if self._scheduler is not None and self._scheduler.running:
            self._scheduler.shutdown(wait=True)
        with _RUNNERS_LOCK:
            if self in _RUNNERS:
                _RUNNERS.remove(self)

    def tick(self) -> None:
        """Jobs in step with the tables, windows moved along, APScheduler woken up."""
        try:
            self.sync()
            for note in windows.advance(self.service):
                self.say(note)
        except Exception as exc:  # the database may be away for a moment: try next tick
            self.say(f"scheduler tick failed ({type(exc).__name__}: {exc}); trying again")
        self.wakeup()

    def wakeup(self) -> None:
        if self._scheduler is not None:
            self._scheduler.wakeup()

    def settle(self, timeout: float = 30.0) -> None:
        """Wake APScheduler and wait until it has looked at its jobs once more and every
        job it handed out has ended (tests use it; it never moves a clock)."""
        with self._settled:
            begun = self._started  # a pass begun after this saw the clock as it is now
        self.wakeup()
        with self._settled:
            if not self._settled.wait_for(
                    lambda: self._passes > begun and self._finished >= self._submitted,
                    timeout):
                raise TimeoutError(f"the scheduler did not settle within {timeout:g}s")

    # --- jobs ---------------------------------------------------------------------------

    def wanted(self) -> dict[str, _Wanted]:
        """The APScheduler jobs the tables call for, by job ID."""
        from apscheduler.triggers.date import DateTrigger

        found: dict[str, _Wanted] = {}
        for schedule in scheduling.listing(self.service):
            if schedule.state not in scheduling.LIVE:
                continue
            try:
                trigger = schedule.trigger()
            except Exception as exc:  # a zone gone from the system: say so, skip it
                self.say(f"schedule {schedule.id}: {exc}")
                continue
            after = scheduling.parse_utc(schedule.last_handled or schedule.created_at)
            first = trigger.get_next_fire_time(None, after + timedelta(microseconds=1))
            found[f"schedule:{schedule.id}:{schedule.revision}"] = _Wanted(
                trigger, self.grace, schedule.state == scheduling.PAUSED, first,
                f"schedule {schedule.id} {schedule.runbook}")
        for window in windows.listing(self.service):
            if window.state == windows.SCHEDULED:
                found[f"window:{window.id}:open"] = _Wanted(
                    DateTrigger(run_date=window.start, timezone=UTC), self.grace, False,
                    window.start, f"window {window.id} opens")
            if window.state in (windows.SCHEDULED, windows.OPENING, windows.OPEN):
                found[f"window:{window.id}:close"] = _Wanted(
                    DateTrigger(run_date=window.end, timezone=UTC), None, False, window.end,
                    f"window {window.id} closes")
        return found

    def sync(self) -> None:
        assert self._scheduler is not None
        wanted = self.wanted()
        jobs = {job.id: job for job in self._scheduler.get_jobs()}
        from apscheduler.jobstores.base import ConflictingIdError, JobLookupError

        for job_id in jobs:
            if job_id not in wanted:
                with contextlib.suppress(JobLookupError):  # APScheduler may have done it
                    self._scheduler.remove_job(job_id)
        for job_id, want in wanted.items():
            job = jobs.get(job_id)
            with contextlib.suppress(JobLookupError, ConflictingIdError):
                if job is None:
                    if want.first is None:
                        continue
                    self._scheduler.add_job(
                        JOB_FUNCTION, trigger=want.trigger, args=[job_id], id=job_id,
                        name=want.name, misfire_grace_time=want.grace, coalesce=True,
                        max_instances=1, next_run_time=None if want.paused else want.first)
                elif want.paused and job.next_run_time is not None:
                    self._scheduler.pause_job(job_id)
                elif not want.paused and job.next_run_time is None:
                    self._scheduler.resume_job(job_id)

    def jobs(self) -> dict[str, datetime | None]:
        """Job ID -> next run time (None: paused)."""
        assert self._scheduler is not None
        return {job.id: job.next_run_time for job in self._scheduler.get_jobs()}

    # --- what APScheduler tells ------------------------------------------------------------

    def _on_event(self, event: Any) -> None:
        from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_MISSED, EVENT_JOB_SUBMITTED

        if event.code == EVENT_JOB_SUBMITTED:
            with self._settled:
                self._submitted += 1
            return
        try:
            if event.code == EVENT_JOB_MISSED:
                self._missed(event.job_id, event.scheduled_run_time)
            elif event.code == EVENT_JOB_ERROR:
                self.say(f"{event.job_id} failed: {event.exception}")
        except Exception as exc:
            self.say(f"{event.job_id}: reporting it failed: {type(exc).__name__}: {exc}")
        finally:
            with self._settled:
                self._finished += 1
                self._settled.notify_all()

    def _missed(self, job_id: str, scheduled: datetime) -> None:
        kind, number, *rest = job_id.split(":")
        scheduled = scheduled.astimezone(UTC)
        if kind == "schedule":
            outcome = scheduling.missed(self.service, int(number), scheduled)
            self.say(f"schedule {number}: fire time {scheduling.utc_iso(scheduled)} "
                     f"{outcome.outcome}: {outcome.detail}")
        elif kind == "window" and rest == ["open"]:
            outcome_text = windows.missed_open(self.service, int(number), scheduled)
            self.say(f"window {number}: start {outcome_text}")

    def run(self, job_id: str) -> None:
        """One job: a schedule's fire time, a window's start or end."""
        try:
            self._run(job_id)
        except Exception as exc:  # the database went away, a bug: say it where people look
            self.say(f"{job_id} failed: {type(exc).__name__}: {exc}")
            try:
                with self.service.db.begin() as conn:
                    audit.append(conn, Kind.SCHEDULER_JOB_FAILED, "scheduler", {
                        "job": job_id, "error": f"{type(exc).__name__}: {exc}"[:2000]})
            except Exception as again:
                self.say(f"{job_id}: could not record the failure either: {again}")

    def _run(self, job_id: str) -> None:
        kind, number, *rest = job_id.split(":")
        if kind == "schedule":
            outcome = scheduling.fire(self.service, int(number))
            self.say(f"schedule {number}: {outcome.outcome}"
                     + (f" execution {outcome.execution_id}" if outcome.execution_id else "")
                     + (f" ({outcome.detail})" if outcome.detail else ""))
        elif kind == "window" and rest == ["open"]:
            self.say(f"window {number}: start: {windows.fire_open(self.service, int(number))}")
        elif kind == "window" and rest == ["close"]:
            self.say(f"window {number}: end: {windows.fire_close(self.service, int(number))}")
        else:
            self.say(f"unknown scheduler job {job_id}: ignored")


def run_job(job_id: str) -> None:
    """What APScheduler calls (by reference, so jobs survive restarts): the running
    scheduler of this process does the work."""
    with _RUNNERS_LOCK:
        runner = _RUNNERS[-1] if _RUNNERS else None
    if runner is None:
        raise RuntimeError(f"no scheduler runs in this process for job {job_id}")
    runner.run(job_id)



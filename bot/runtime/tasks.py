"""Background tasks of ``runbook serve``: loops that run until told to stop. Leader-only
tasks run in one replica at a time (bot.runtime.leadership)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bot.alerts import intake
from bot.execution.engine import Engine, Reporter
from bot.schedule.scheduler import Scheduler, log_line
from bot.service import Service
from bot.store import checkpoints
from bot.store.db import now_iso


@dataclass(frozen=True)
class Task:
    """A loop that runs until ``stop`` is set."""

    name: str
    run: Callable[[threading.Event], None]
    leader_only: bool = True


def engine_task(service: Service, report: Reporter) -> Task:
    def run(stop: threading.Event) -> None:
        engine = Engine(service, report=report)
        try:
            engine.run_pending(stop=stop, hand_over=True)
        finally:
            engine.close()

    return Task("engine", run)


def scheduler_task(service: Service, say: Callable[[str], None] = log_line) -> Task:
    """The leader-only serve task: start the scheduler, tick every poll, stop with the task."""
    def run(stop: threading.Event) -> None:
        poll = service.config.scheduling.poll_seconds
        runner: Scheduler | None = None
        try:
            while not stop.is_set():
                if runner is None:  # (again) after the database refused the start
                    candidate = Scheduler(service, say)
                    try:
                        candidate.start()
                        runner = candidate
                    except Exception as exc:
                        say(f"the scheduler could not start ({type(exc).__name__}: {exc}); "
                            f"trying again in {poll:g}s")
                        candidate.stop()
                else:
                    runner.tick()
                stop.wait(poll)
        finally:
            if runner is not None:
                runner.stop()

    return Task(name="scheduler", run=run, leader_only=True)


def checkpoint_task(service: Service, path: Path | None, say: Callable[[str], None] = log_line,
                    post: Callable[[checkpoints.Checkpoint], None] | None = None) -> Task:
    """The leader records the audit log's head to ``path`` every
    ``audit.checkpoint_seconds`` (bot.store.checkpoints), and once more when it stops;
    ``post`` also hands each new head to the chat (audit.checkpoint_chat)."""
    posted: list[tuple[int, str]] = []

    def record() -> None:
        try:
            if path is not None:
                checkpoints.record(service.db, path)
            if post is not None:
                seq, digest = checkpoints.head(service.db)
                if posted[-1:] != [(seq, digest)]:
                    post(checkpoints.Checkpoint(seq, digest, now_iso()))
                    posted[:] = [(seq, digest)]
        except Exception as exc:  # a file, chat or database problem: said, tried again
            say(f"audit checkpoint not recorded: {exc}")

    def run(stop: threading.Event) -> None:
        record()
        while not stop.wait(service.config.audit.checkpoint_seconds):
            record()
        record()  # the head as this leader leaves it

    return Task(name="audit-checkpoints", run=run, leader_only=True)


def intake_task(service: Service, say: Callable[[str], None] = log_line) -> Task:
    """The leader takes in faults the bot did not raise (bot.alerts.intake) every
    ``remediation.intake.every`` seconds (0: never)."""

    def run(stop: threading.Event) -> None:
        every = service.config.remediation.intake.every
        while every > 0 and not stop.wait(every):
            try:
                touched = intake.scan(service)
            except Exception as exc:  # a system that does not answer: said, tried again
                say(f"not read this time: {exc}")
                continue
            for proposal in touched:
                say(f"proposal {proposal.id} ({proposal.alertname} on "
                    f"{proposal.labels.get('node')}): {proposal.state}")

    return Task(name="intake", run=run, leader_only=True)

"""Shipping the audit log (``ship_tasks``): a leader-only task per configured destination
sends every event to it, in chain order, at least once, from its cursor (bot.store.shipping)
and moves the cursor only after the destination accepted the batch. A failure is retried
from the cursor after a growing wait; nothing is ever skipped but what is no longer there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import Engine

from adapters.auditlog import Accepted, DeliveryError, DestinationSetupError, Event
from bot.config import ShipConfig
from bot.runtime.tasks import Task
from bot.schedule.scheduler import log_line
from bot.service import Service
from bot.store import shipping

RETRY_AFTER_CAP = 300.0  # a receiver's Retry-After is honoured up to this many seconds


class Destination(Protocol):
    """A receiver's client (adapters.syslog, adapters.otlp)."""

    name: str

    def send(self, events: Sequence[Event]) -> Accepted: ...

    def close(self) -> None: ...


class ShippingSetupError(Exception):
    """A destination cannot be used as configured; the message says which and why."""


def destination_names(settings: ShipConfig) -> list[str]:
    """The configured destinations as their clients and cursors name them."""
    return ([settings.syslog.address] if settings.syslog else []) + (
        [settings.otlp.logs_url] if settings.otlp else [])


def destinations(settings: ShipConfig) -> list[Destination]:
    """A client for each configured destination (their packages load only when used)."""
    found: list[Destination] = []
    try:
        if settings.syslog is not None:
            from adapters.syslog.client import SyslogClient
            found.append(SyslogClient(settings.syslog))
        if settings.otlp is not None:
            from adapters.otlp.client import OtlpClient
            found.append(OtlpClient(settings.otlp))
    except DestinationSetupError as exc:
        raise ShippingSetupError(f"audit.ship: {exc}") from exc
    return found


@dataclass
class Backoff:
    """The wait after a failure: ``first``, doubled at each failure up to ``most``; a
    refusal that will not change by itself waits ``most`` at once."""

    first: float
    most: float
    current: float = 0.0

    def after(self, error: DeliveryError) -> float:
        wait = self.most if not error.retryable else (
            min(self.current * 2, self.most) if self.current else self.first)
        self.current = wait
        if error.retry_after is not None:
            wait = max(wait, min(error.retry_after, RETRY_AFTER_CAP))
        return wait

    def reset(self) -> None:
        self.current = 0.0


class Shipper:
    """Streams the log to one destination; ``run`` until stopped, ``step`` one batch."""

    def __init__(self, engine: Engine, destination: Destination, settings: ShipConfig,
                 say: Callable[[str], None] = log_line) -> None:
        self.engine, self.destination, self.settings = engine, destination, settings
        self.say = say
        self.backoff = Backoff(settings.retry_seconds, settings.max_retry_seconds)
        self._warned: set[str] = set()  # a warning is said once per shipper
        self._failing = ""

    def run(self, stop: threading.Event) -> None:
        self.say(f"shipping the audit log to {self.destination.name}")
        try:
            while not stop.is_set():
                self._attempt(stop)
        finally:
            self.destination.close()  # a later leadership term opens it again

    def _attempt(self, stop: threading.Event) -> None:
        try:
            sent = self.step()
        except DeliveryError as exc:
            self._failed(str(exc), stop, self.backoff.after(exc))
            return
        except Exception as exc:  # the database: said, and tried again like a delivery
            error = DeliveryError(f"{type(exc).__name__}: {exc}")
            self._failed(str(error), stop, self.backoff.after(error))
            return
        if self._failing:
            self.say(f"{self.destination.name}: delivering again")
            self._failing = ""
        self.backoff.reset()
        if sent < self.settings.batch:  # caught up: look again in a moment
            stop.wait(self.settings.interval_seconds)

    def _failed(self, problem: str, stop: threading.Event, wait: float) -> None:
        if problem != self._failing:  # a long outage is said once, not at every retry
            self.say(f"{self.destination.name}: not delivered ({problem}); sending again "
                     f"from the cursor, first in {wait:g}s")
            self._failing = problem
        stop.wait(wait)

    def step(self) -> int:
        """Send the events after the cursor (one batch) and move the cursor over them;
        how many were sent (0: nothing new)."""
        at = shipping.cursor(self.engine, self.destination.name)
        events = shipping.following(self.engine, max(at.seq - 1, 0), self.settings.batch + 1)
        if events and events[0].seq == at.seq:  # the last one shipped: is it still the same?
            self._same_as_shipped(at, events.pop(0))
        events = events[: self.settings.batch]
        if not events:
            self._behind_the_cursor(at)
            return 0
        skipped = self._gaps(at, events)
        accepted = self.destination.send(events)
        if accepted.rejected:
            self.say(f"warning: {self.destination.name} accepted events {events[0].seq}-"
                     f"{events[-1].seq} but dropped {accepted.rejected} of them "
                     f"({accepted.note or 'no reason given'}); they are not sent again")
        if not shipping.move(self.engine, at, events[-1].seq, events[-1].hash,
                             skipped=skipped, rejected=accepted.rejected):
            self.say(f"{self.destination.name}: the cursor moved meanwhile (another "
                     "replica led); going on from where it is now")
        return len(events)

    def _gaps(self, at: shipping.Cursor, events: list[Event]) -> int:
        """Warn about events gone before they were shipped (an archive moved them out,
        or someone deleted them) and count them: the cursor moves past them."""
        expected, missing = at.seq + 1, 0
        for event in events:
            if event.seq != expected:
                self._warn_gap(expected, event.seq - 1)
                missing += event.seq - expected
            expected = event.seq + 1
        return missing

    def _warn_gap(self, first: int, last: int) -> None:
        one = first == last
        span = f"event {first}" if one else f"events {first}-{last}"
        name = self.destination.name
        if last <= shipping.archived_through(self.engine):
            self._warn(f"warning: {span} {'was' if one else 'were'} archived before "
                       f"{'it' if one else 'they'} reached {name} (runbook audit archive): "
                       "send it the archive file yourself")
        else:
            self._warn(f"warning: {span} {'is' if one else 'are'} missing from the log and "
                       f"never reached {name}: `runbook audit verify` says what happened")

    def _behind_the_cursor(self, at: shipping.Cursor) -> None:
        """The log ends before the cursor (a database restored from a backup): go back to
        its end, so that the events written from there are shipped too."""
        seq, digest = shipping.head(self.engine)
        if seq < at.seq:
            self._warn(f"warning: the audit log ends at event {seq} but {self.destination.name}"
                       f" already has up to {at.seq} (a database restored from a backup?): "
                       f"events from {seq + 1} on will be shipped again, with new hashes")
            shipping.move(self.engine, at, seq, digest)

    def _same_as_shipped(self, at: shipping.Cursor, event: Event) -> None:
        if at.hash and event.hash != at.hash:
            self._warn(f"warning: event {at.seq} is not the one {self.destination.name} "
                       "received (its hash differs): the log was written again; "
                       "`runbook audit verify --checkpoints` says where")

    def _warn(self, line: str) -> None:
        if line not in self._warned:
            self._warned.add(line)
            self.say(line)


def ship_tasks(service: Service, say: Callable[[str], None] = log_line) -> list[Task]:
    """One leader-only task per destination in ``audit.ship``; ShippingSetupError when one
    cannot be used as configured (checked before ``runbook serve`` starts anything)."""
    settings = service.config.audit.ship
    return [Task(name=f"audit-ship {destination.name}",
                 run=Shipper(service.db, destination, settings, say).run, leader_only=True)
            for destination in destinations(settings)]

"""An engine's claims on the executions it drives (``Claims``): taking one (a new epoch and
a lease in the row), the fence every later write of the engine passes (``write``), and the
heartbeat that renews the leases and the executions' locks.

It knows nothing of plans, steps or checks; an engine that lost a claim writes nothing more.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy import Connection, or_, select, text, update
from sqlalchemy import Engine as SqlEngine

from adapters.actions import ActionContext
from bot.config import Config
from bot.execution import locking
from bot.execution.executions import ACTIVE
from bot.store import audit
from bot.store.schema import executions as executions_table
from bot.store.words import Kind

ENGINE = "engine"  # the audit actor for what the engine does on its own
# An engine that could not renew a lease for this share of it stops acting on its own:
# well before another engine may take the execution over.
STALE_SHARE = 0.6


class Store(Protocol):
    """What the claims need of the command service: the settings and the database."""

    @property
    def config(self) -> Config: ...

    @property
    def db(self) -> SqlEngine: ...


class Stop(Exception):
    """This engine must stop driving the execution (claim lost, or handing over)."""


@dataclass
class Claim:
    """One engine's claim on one execution: its epoch, and what it knows of the last one."""

    execution_id: int
    epoch: int
    previous_owner: str | None
    previous_lease: float | None
    renewed: float = field(default_factory=time.monotonic)  # last renewal that succeeded
    lost: threading.Event = field(default_factory=threading.Event)
    reason: str = ""
    running: dict[int, ActionContext] = field(default_factory=dict)

    def lose(self, reason: str) -> None:
        if not self.lost.is_set():
            self.reason = reason
            self.lost.set()
        for ctx in list(self.running.values()):
            ctx.request_stop(f"this engine lost the execution: {reason}")


class Claims:
    """One engine's claims, one per execution it drives. A claim writes ``owner`` and a lease
    into the row and bumps its ``epoch``; every later write is one transaction fenced on that
    epoch (``write``), so an engine that lost its claim writes nothing more. A heartbeat
    renews the leases and the executions' locks; another engine takes over only once a lease
    ran out."""

    def __init__(self, service: Store, owner: str) -> None:
        self.service = service
        self.owner = owner
        self._claims: dict[int, Claim] = {}
        self._guard = threading.Lock()
        self._beat = threading.Event()
        self._heart: threading.Thread | None = None
        # Fault injection for the lab's kill -9 tests (lab configurations only): the process
        # kills itself right after committing the audit event named here ("kind" or
        # "kind:step"), so each stage boundary can be crashed at deterministically.
        self._crash_after = (os.environ.get("RUNBOOK_LAB_CRASH_AFTER") or None
                             if service.config.lab else None)
        self._written = threading.local()

    @property
    def lease(self) -> float:
        return self.service.config.engine.lease_seconds

    def take(self, execution_id: int) -> Claim | None:
        """Claim the execution unless another live engine has it."""
        now = time.time()
        table = executions_table
        with self.service.db.begin() as conn:
            before = conn.execute(
                select(table.c.owner, table.c.lease_until).where(table.c.id == execution_id)
            ).first()
            epoch = conn.execute(
                update(table)
                .where(
                    table.c.id == execution_id,
                    table.c.state.in_(sorted(ACTIVE)),
                    or_(table.c.owner.is_(None), table.c.lease_until < now),
                )
                .values(owner=self.owner, lease_until=now + self.lease, epoch=table.c.epoch + 1,
                        row_version=table.c.row_version + 1)
                .returning(table.c.epoch)
            ).scalar()
        if epoch is None or before is None:
            return None
        taken = Claim(execution_id, int(epoch), before.owner, before.lease_until)
        with self._guard:
            old = self._claims.get(execution_id)
            if old is not None:
                old.lose("this engine claimed it again")
            self._claims[execution_id] = taken
        self._start_heart()
        return taken

    def let_go(self, claim: Claim) -> None:
        """Give the claim back (the row's owner and lease cleared) unless it was lost or an
        action of it may still be running."""
        with self._guard:
            if self._claims.get(claim.execution_id) is claim:
                del self._claims[claim.execution_id]
        if claim.lost.is_set() or claim.running:
            return  # the lease runs out by itself; the next engine waits for that
        with self.service.db.begin() as conn:
            conn.execute(
                update(executions_table)
                .where(executions_table.c.id == claim.execution_id,
                       executions_table.c.epoch == claim.epoch,
                       executions_table.c.owner == self.owner)
                .values(owner=None, lease_until=None)
            )

    def _start_heart(self) -> None:
        if self._heart is None or not self._heart.is_alive():
            self._heart = threading.Thread(target=self._heartbeat, name="lease", daemon=True)
            self._heart.start()

    def _heartbeat(self) -> None:
        """Every fifth of a lease, renew the leases of this engine's claims and their
        executions' locks. While the database is away it keeps trying; a claim not renewed
        for ``STALE_SHARE`` of a lease is given up by itself (``check_stale``) and its
        running actions are told to stop, well before another engine may take it over."""
        while not self._beat.wait(self.lease / 5):
            with self._guard:
                claims = list(self._claims.values())
            if not claims:
                continue
            try:
                self.renew(claims)
            except Exception as exc:  # the database is away: keep trying, give up in time
                for claim in claims:
                    self.check_stale(claim, f"{type(exc).__name__}: {exc}")

    def renew(self, claims: list[Claim]) -> None:
        """Renew the leases of these claims and their executions' locks, in one transaction."""
        now = time.time()
        lock_until = now + self.service.config.engine.lock_ttl_seconds
        with self.service.db.begin() as conn:
            renewed: list[Claim] = []
            for claim in claims:
                if claim.lost.is_set():
                    continue
                if conn.execute(
                    update(executions_table)
                    .where(executions_table.c.id == claim.execution_id,
                           executions_table.c.epoch == claim.epoch,
                           executions_table.c.owner == self.owner)
                    .values(lease_until=now + self.lease)
                ).rowcount:
                    locking.renew(conn, claim.execution_id, lock_until)
                    renewed.append(claim)
                else:
                    claim.lose("another engine claimed it (its lease had run out)")
        for claim in renewed:  # only once the transaction committed
            claim.renewed = time.monotonic()

    def check_stale(self, claim: Claim, why: str = "") -> None:
        """Give the claim up when the lease may be running out without a renewal."""
        silent_for = time.monotonic() - claim.renewed
        if silent_for > self.lease * STALE_SHARE:
            claim.lose(f"could not renew its lease for {silent_for:.0f}s"
                       + (f" ({why[:200]})" if why else ""))

    def close(self) -> None:
        self._beat.set()

    @contextmanager
    def write(self, claim: Claim) -> Iterator[Connection]:
        """A transaction that commits only while this engine's claim is the current one."""
        self.check_stale(claim)
        if claim.lost.is_set():
            raise Stop(f"execution {claim.execution_id}: {claim.reason}")
        self._written.events = []
        with self.service.db.begin() as conn:
            if not conn.execute(_FENCE, {"id": claim.execution_id, "epoch": claim.epoch,
                                         "owner": self.owner}).rowcount:
                claim.lose("another engine claimed it")
                raise Stop(f"execution {claim.execution_id}: another engine took it over")
            yield conn
        if self._crash_after and self._crash_after in self._written.events:
            os.kill(os.getpid(), signal.SIGKILL)

    def event(self, conn: Connection, kind: Kind, data: dict[str, Any],
              execution_id: int) -> None:
        """An audit event by the engine (inside ``write``)."""
        audit.append(conn, kind, ENGINE, data, execution_id)
        if self._crash_after:
            self._written.events = [*getattr(self._written, "events", []), kind,
                                    f"{kind}:{data.get('step', data.get('check', ''))}"]

    def held(self) -> list[Claim]:
        """The claims this engine holds now."""
        with self._guard:
            return list(self._claims.values())


# Built once: the engine runs it at every step (a statement built per call costs more than
# the query itself on SQLite). The fence takes the row (and on PostgreSQL locks it) only
# while the claim is still this engine's: the same compare-and-set as update_if.
_FENCE = text("UPDATE executions SET row_version = row_version + 1 "
              "WHERE id = :id AND epoch = :epoch AND owner = :owner")


__all__ = ["ENGINE", "STALE_SHARE", "Claim", "Claims", "Stop", "Store"]

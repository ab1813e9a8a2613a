"""Named locks (``node:gpu07``) in the database, with owner, TTL and a fencing token; a
maintenance window holds its nodes through them (``WindowHold``).

Every function works inside the caller's transaction and never commits; which locks a
request needs is decided by planning (bot.execution.planning), not here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, delete, func, select, text, update

from bot.store import audit
from bot.store.db import now_iso
from bot.store.schema import counters, executions, locks, maintenance_windows
from bot.store.words import Kind
from kit import hostlist

_PG_LOCKS_LOCK = 0x6770_6C6B  # advisory lock key: serialises lock acquisition on PostgreSQL
# The states of a maintenance window (bot.schedule.windows) in which it holds its nodes.
WINDOW_HOLDS = ("opening", "open", "closing")


class LockConflict(Exception):
    """A lock is held by another execution; the message names it, its requester and since when."""


def next_token(conn: Connection, name: str = "fencing") -> int:
    updated = conn.execute(
        update(counters).where(counters.c.name == name).values(value=counters.c.value + 1)
    )
    if updated.rowcount == 0:
        conn.execute(counters.insert().values(name=name, value=1))
        return 1
    value = conn.execute(select(counters.c.value).where(counters.c.name == name)).scalar_one()
    return int(value)


@dataclass(frozen=True)
class WindowHold:
    """A maintenance window that holds its nodes (opening, open or closing): from the request
    of its ``open-window`` until the window has ended (closed, failed, cancelled or missed).

    Its locks are the ``node:NAME`` rows its open-window execution took when it was
    requested. When that execution ends they stay, with its ID (``release`` keeps them),
    until ``release_window``, which bot.schedule.windows calls on the window's last
    transition. They are not renewed and their expiry does not apply: they last as long as
    the window. Anyone else asking for one of those nodes is refused with the window named.
    """

    window_id: int
    nodes: str  # hostlist
    state: str
    created_by: str
    execution_id: int  # its open-window execution: the rows it holds carry this ID
    ends_at: float  # its scheduled end (epoch seconds); it holds its nodes until it closes

    def describe(self, now: float | None = None) -> str:
        end = datetime.fromtimestamp(self.ends_at, UTC).strftime("%Y-%m-%d %H:%M UTC")
        if (time.time() if now is None else now) >= self.ends_at:  # over: it is closing
            return (f"maintenance window {self.window_id} ({self.state} on {self.nodes}, past "
                    f"its end at {end}: it holds its nodes until its runs inside end and "
                    f"close-window has run; created by {self.created_by})")
        return (f"maintenance window {self.window_id} ({self.state} on {self.nodes} until "
                f"{end}, created by {self.created_by})")


def window_holds(conn: Connection) -> dict[str, WindowHold]:
    """The node locks maintenance windows hold now: lock name -> window."""
    rows = conn.execute(
        select(maintenance_windows).where(
            maintenance_windows.c.state.in_(WINDOW_HOLDS),
            maintenance_windows.c.open_execution_id.is_not(None))
    ).all()
    found: dict[str, WindowHold] = {}
    for row in rows:
        starts = datetime.fromisoformat(row.starts_at.replace("Z", "+00:00"))
        hold = WindowHold(row.id, row.nodes, row.state, row.created_by,
                          row.open_execution_id, starts.timestamp() + row.duration_seconds)
        for node in hostlist.expand(row.nodes):
            found[f"node:{node}"] = hold
    return found


def acquire(
    conn: Connection, names: Sequence[str], execution_id: int, owner: str, expires_at: float,
    now: float, *, window_id: int | None = None,
) -> int:
    """Take every lock in ``names`` for the execution, or raise LockConflict taking none.

    An execution takes all its locks when it is requested, so a second request for the same
    node is refused at once with who holds it and since when; an expired lock is taken over
    (the audit log says so). All-or-nothing, in the plan's (sorted) order, one acquirer at a
    time on PostgreSQL (an advisory lock). Returns the fencing token, which grows with every
    acquisition (see ``holds``).

    ``window_id``: the execution is a run of that maintenance window (requested by the
    window itself: a runbook inside it, its close-window), so it may take the node locks the
    window holds: the row is lent to it (its execution ID and fencing token, as for any
    lock) and goes back to the window when that run ends (``release``).
    """
    if not names:
        return 0
    _serialise(conn)
    wanted = list(dict.fromkeys(names))
    holds = window_holds(conn)
    held = {row.name: row
            for row in conn.execute(select(locks).where(locks.c.name.in_(wanted))).all()}
    lent: dict[int, list[str]] = {}
    taken_over = []
    for name in wanted:
        hold, row = holds.get(name), held.get(name)
        if hold is not None and hold.window_id != window_id:
            raise LockConflict(_held_by_window(conn, name, hold, row))
        if row is None or row.execution_id == execution_id:
            continue
        if hold is not None and row.execution_id == hold.execution_id:
            lent.setdefault(hold.window_id, []).append(name)  # its window lends it
        elif row.expires_at > now:
            raise LockConflict(_held_by_execution(conn, row))
        else:
            taken_over.append(row)
    conn.execute(delete(locks).where(locks.c.name.in_(wanted)))
    token = next_token(conn)
    acquired = now_iso()
    conn.execute(
        locks.insert(),
        [
            {"name": name, "execution_id": execution_id, "owner": owner, "acquired_at": acquired,
             "expires_at": expires_at, "token": token}
            for name in wanted
        ],
    )
    # The log last: the rows are written before this transaction waits for the audit chain.
    for row in taken_over:  # expired: taken over, and the log says so
        audit.append(conn, Kind.LOCK_TAKEN_OVER, owner,
                     {"lock": row.name, "from_execution": row.execution_id, "token": row.token},
                     execution_id)
    for window_id, lent_names in lent.items():
        audit.append(conn, Kind.LOCKS_LENT, owner, {
            "window": window_id, "locks": compact(lent_names),
            "from_execution": holds[lent_names[0]].execution_id}, execution_id)
    return token


def _serialise(conn: Connection) -> None:
    if conn.dialect.name == "postgresql":
        # One acquirer at a time: concurrent requests would otherwise deadlock on the
        # counters row and the lock rows they both read, delete and write.
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCKS_LOCK})


def _runbook_of(conn: Connection, execution_id: int) -> str | None:
    return conn.execute(
        select(executions.c.runbook).where(executions.c.id == execution_id)
    ).scalar()


def _held_by_execution(conn: Connection, row: Any) -> str:
    until = datetime.fromtimestamp(row.expires_at, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    return (f"{row.name} is held by execution {row.execution_id} "
            f"({_runbook_of(conn, row.execution_id)}, requested by {row.owner}) since "
            f"{row.acquired_at}; it expires at {until} unless renewed")


def _held_by_window(conn: Connection, name: str, hold: WindowHold, row: Any) -> str:
    lent = ""
    if row is not None and row.execution_id != hold.execution_id:
        lent = (f"; lent now to its run, execution {row.execution_id} "
                f"({_runbook_of(conn, row.execution_id)})")
    return (f"{name} is held by {hold.describe()}{lent}: while it is open only the runbooks "
            f"the window runs act on its nodes (`window show {hold.window_id}`; "
            f"`window cancel {hold.window_id}` closes it early)")


def compact(names: Sequence[str]) -> list[str]:
    """Lock names for people and the audit log: the node locks as one hostlist
    (``node:gpu[001-128]``) where the first of them was, the others as they are."""
    nodes = [name.removeprefix("node:") for name in names if name.startswith("node:")]
    try:
        grouped = f"node:{hostlist.compress(nodes)}" if len(nodes) > 1 else None
    except ValueError:  # a runbook's own lock that is no node name: shown as it is
        grouped = None
    if grouped is None:
        return list(names)
    shown: list[str] = []
    for name in names:
        if not name.startswith("node:"):
            shown.append(name)
        elif grouped not in shown:
            shown.append(grouped)
    return shown


def renew(conn: Connection, execution_id: int, expires_at: float) -> None:
    """Push the execution's locks' expiry to ``expires_at``: locks expire unless the engine
    driving the execution renews them (its heartbeat)."""
    conn.execute(
        update(locks).where(locks.c.execution_id == execution_id).values(expires_at=expires_at)
    )


def release(conn: Connection, execution_id: int) -> list[str]:
    """Release the execution's locks, on every ending (executions.finish); returns the names
    released.

    A node lock of a maintenance window that is opening, open or closing is not released
    but goes back to the window: kept by its open-window execution (whose ending this may
    be) or returned by a run the window lent it to.
    """
    rows = conn.execute(select(locks).where(locks.c.execution_id == execution_id)).all()
    if not rows:
        return []
    holds = window_holds(conn) if any(r.name.startswith("node:") for r in rows) else {}
    back: dict[int, list[str]] = {}
    for row in rows:
        if row.name in holds:
            back.setdefault(holds[row.name].window_id, []).append(row.name)
    # No serialising here (it would take the acquirers' advisory lock after the caller may
    # have taken the audit chain's): an acquirer racing this sees the row as the run's
    # (and is refused) or as the window's again; anybody else is refused by the window.
    for names in back.values():
        hold = holds[names[0]]
        conn.execute(
            update(locks).where(locks.c.execution_id == execution_id, locks.c.name.in_(names))
            .values(execution_id=hold.execution_id, owner=hold.created_by,
                    expires_at=hold.ends_at)
        )
        if hold.execution_id != execution_id:
            audit.append(conn, Kind.LOCKS_RETURNED, "bot", {
                "window": hold.window_id, "locks": compact(names),
                "to_execution": hold.execution_id}, execution_id)
    names = [row.name for row in rows if row.name not in holds]
    conn.execute(delete(locks).where(locks.c.execution_id == execution_id,
                                     locks.c.name.in_(names)))
    return names


def release_window(conn: Connection, window_id: int) -> list[str]:
    """The window has ended: release the node locks it holds (its open-window execution's,
    once that execution has ended). Returns the names released."""
    open_id = conn.execute(
        select(maintenance_windows.c.open_execution_id)
        .where(maintenance_windows.c.id == window_id)
    ).scalar()
    if open_id is None:
        return []
    ended = conn.execute(
        select(executions.c.finished_at).where(executions.c.id == open_id)
    ).scalar()
    if ended is None:  # still running: its own ending releases them (the window is over)
        return []
    names = list(conn.execute(
        select(locks.c.name).where(locks.c.execution_id == open_id)
    ).scalars())
    conn.execute(delete(locks).where(locks.c.execution_id == open_id))
    if names:
        audit.append(conn, Kind.LOCKS_RELEASED, "bot",
                     {"window": window_id, "locks": compact(sorted(names))}, open_id)
    return names


def holds(conn: Connection, execution_id: int, token: int, expected: int) -> bool:
    """True when the execution still holds all ``expected`` locks with ``token``. The engine
    checks before each step, so an execution that lost its locks stops instead of acting on
    a node someone else now holds."""
    if expected == 0:
        return True
    count = conn.execute(
        select(func.count()).select_from(locks).where(
            locks.c.execution_id == execution_id, locks.c.token == token
        )
    ).scalar_one()
    return int(count) == expected

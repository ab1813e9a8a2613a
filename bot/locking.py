"""Named locks (``node:gpu07``) in the database, with owner, TTL and a fencing token.

An execution takes all its locks when it is requested, so a second request for
the same node is refused at once with who holds it and since when. Locks expire
(an engine renews them while it drives the execution) and are released on every
ending. The fencing token grows with every acquisition: the engine checks before
each step that its execution still holds its locks with its token, so an
execution that lost its locks stops instead of acting on a node someone else now
holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import Connection, delete, func, select, text, update

from bot import audit
from bot.store.db import now_iso
from bot.store.schema import counters, executions, locks

_PG_LOCKS_LOCK = 0x6770_6C6B  # advisory lock key: serialises lock acquisition on PostgreSQL


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


def acquire(
    conn: Connection, names: Sequence[str], execution_id: int, owner: str, expires_at: float,
    now: float,
) -> int:
    """Take every lock in ``names`` for the execution, or raise LockConflict taking none."""
    if not names:
        return 0
    if conn.dialect.name == "postgresql":
        # One acquirer at a time: concurrent requests would otherwise deadlock on the
        # counters row and the lock rows they both read, delete and write.
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCKS_LOCK})
    held = conn.execute(select(locks).where(locks.c.name.in_(list(names)))).all()
    for row in held:
        if row.expires_at > now and row.execution_id != execution_id:
            runbook = conn.execute(
                select(executions.c.runbook).where(executions.c.id == row.execution_id)
            ).scalar()
            until = datetime.fromtimestamp(row.expires_at, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
            raise LockConflict(
                f"{row.name} is held by execution {row.execution_id} ({runbook}, requested by "
                f"{row.owner}) since {row.acquired_at}; it expires at {until} unless renewed"
            )
    for row in held:  # expired: taken over, and the log says so
        audit.append(conn, "lock_taken_over", owner,
                     {"lock": row.name, "from_execution": row.execution_id, "token": row.token},
                     execution_id)
    conn.execute(delete(locks).where(locks.c.name.in_(list(names))))
    token = next_token(conn)
    acquired = now_iso()
    conn.execute(
        locks.insert(),
        [
            {"name": name, "execution_id": execution_id, "owner": owner, "acquired_at": acquired,
             "expires_at": expires_at, "token": token}
            for name in names
        ],
    )
    return token


def renew(conn: Connection, execution_id: int, expires_at: float) -> None:
    conn.execute(
        update(locks).where(locks.c.execution_id == execution_id).values(expires_at=expires_at)
    )


def release(conn: Connection, execution_id: int) -> list[str]:
    names = list(conn.execute(
        select(locks.c.name).where(locks.c.execution_id == execution_id)
    ).scalars())
    conn.execute(delete(locks).where(locks.c.execution_id == execution_id))
    return names


def holds(conn: Connection, execution_id: int, token: int, expected: int) -> bool:
    """True when the execution still holds all ``expected`` locks with ``token``."""
    if expected == 0:
        return True
    count = conn.execute(
        select(func.count()).select_from(locks).where(
            locks.c.execution_id == execution_id, locks.c.token == token
        )
    ).scalar_one()
    return int(count) == expected

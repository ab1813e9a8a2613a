"""The lock table's promises, each against the mutant that would break it: ``holds`` needs
every expected lock and the execution's own fencing token; tokens grow with each
acquisition; ``renew`` touches only its execution's locks; an expired lock taken over is
audited."""

from __future__ import annotations

from sqlalchemy import select

from bot.execution import locking
from bot.store import audit, db
from bot.store.schema import locks


def test_holds_needs_every_lock_and_the_token(sqlite_url: str) -> None:
    engine = db.connect(sqlite_url)
    with engine.begin() as conn:
        token = locking.acquire(conn, ["node:gpu01", "node:gpu02"], 1, "alice", 2e9, 1e9)
        assert locking.holds(conn, 1, token, 2)
        assert not locking.holds(conn, 1, token + 1, 2)  # another token: not these locks
        assert not locking.holds(conn, 1, token, 3)  # one expected lock missing
        conn.execute(locks.delete().where(locks.c.name == "node:gpu02"))
        assert not locking.holds(conn, 1, token, 2)  # lost one of them: not all
    engine.dispose()


def test_tokens_grow_and_renew_touches_only_its_own_locks(sqlite_url: str) -> None:
    engine = db.connect(sqlite_url)
    with engine.begin() as conn:
        first = locking.acquire(conn, ["node:gpu01"], 1, "alice", 100.0, 50.0)
        second = locking.acquire(conn, ["node:gpu02"], 2, "bob", 100.0, 50.0)
        assert second > first >= 1
        locking.renew(conn, 1, 500.0)
        expiry = dict(conn.execute(select(locks.c.name, locks.c.expires_at)).all())
    assert expiry == {"node:gpu01": 500.0, "node:gpu02": 100.0}
    engine.dispose()


def test_an_expired_lock_taken_over_is_audited_with_a_new_token(sqlite_url: str) -> None:
    engine = db.connect(sqlite_url)
    with engine.begin() as conn:
        old = locking.acquire(conn, ["node:gpu01"], 1, "alice", 100.0, 50.0)
    with engine.begin() as conn:
        new = locking.acquire(conn, ["node:gpu01"], 2, "bob", 300.0, 200.0)  # 1's expired
        assert new > old and locking.holds(conn, 2, new, 1) and not locking.holds(conn, 1, old,
                                                                                1)
    with engine.connect() as conn:
        taken = [e for e in audit.events(conn) if e["kind"] == "lock_taken_over"]
    assert [(e["data"]["lock"], e["data"]["from_execution"]) for e in taken] == [
        ("node:gpu01", 1)]
    engine.dispose()

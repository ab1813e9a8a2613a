"""The lock table's promises, each against the mutant that would break it: ``holds`` needs
every expected lock and the execution's own fencing token; tokens grow with each
acquisition; ``renew`` touches only its execution's locks; an expired lock taken over is
audited."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import Connection, select, text

from bot.execution import locking
from bot.store import audit, db
from bot.store.db import now_iso
from bot.store.schema import executions, locks, maintenance_windows
from tests.bot.execution.test_engine import record, runbook
from tests.bot.store.test_audit import PostgresLike
from tests.conftest import BotFactory


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


STARTS = "2030-01-01T00:00:00Z"  # a window of an hour from here: it ends at 1893459600


def window_row(conn: Connection, nodes: str, open_execution_id: int) -> int:
    """A maintenance window, open on ``nodes``, whose open-window run is that execution."""
    key = conn.execute(maintenance_windows.insert().values(
        nodes=nodes, starts_at=STARTS, duration_seconds=3600.0, reason="r", runbooks="[]",
        plans="[]", digest="d", created_by="carol", created_at=now_iso(), state="open",
        open_execution_id=open_execution_id, runs="[]", updated_at=now_iso(),
    )).inserted_primary_key
    assert key is not None
    return int(key[0])


def rows(conn: Connection) -> dict[str, tuple[int, str, float]]:
    return {r.name: (r.execution_id, r.owner, r.expires_at) for r in conn.execute(select(locks))}


def logged(conn: Connection, kind: str) -> list[tuple[str, dict[str, Any], int | None]]:
    return [(e["actor"], e["data"], e["execution_id"]) for e in audit.events(conn)
            if e["kind"] == kind]


def test_a_window_lends_its_nodes_to_its_runs_and_takes_them_back(sqlite_url: str) -> None:
    engine = db.connect(sqlite_url)
    with engine.begin() as conn:
        opened = locking.acquire(conn, ["node:gpu01", "node:gpu02"], 10, "carol", 2e9, 1e9)
        window = window_row(conn, "gpu[01-02]", 10)
        hold = locking.window_holds(conn)["node:gpu01"]
        assert (hold.window_id, hold.execution_id, hold.ends_at) == (window, 10, 1893459600.0)
        run = locking.acquire(conn, ["node:gpu01", "site"], 11, "bot", 3e9, 1e9,
                              window_id=window)
        assert logged(conn, "locks_lent") == [
            ("bot", {"window": window, "locks": ["node:gpu01"], "from_execution": 10}, 11)]
        assert locking.holds(conn, 11, run, 2)
        assert locking.release(conn, 11) == ["site"]  # the node goes back to the window
        assert rows(conn) == {"node:gpu01": (10, "carol", 1893459600.0),
                              "node:gpu02": (10, "carol", 2e9)}
        assert logged(conn, "locks_returned") == [
            ("bot", {"window": window, "locks": ["node:gpu01"], "to_execution": 10}, 11)]
        assert not locking.holds(conn, 11, run, 1)  # its token is on the window's row now
        assert locking.release(conn, 10) == []  # the window's own run: kept, no return said
        assert len(logged(conn, "locks_returned")) == 1
        assert locking.holds(conn, 10, opened, 1)  # gpu02 still under the window's token
    engine.dispose()


def test_a_window_holding_a_node_is_named_with_the_run_it_is_lent_to(sqlite_url: str,
                                                                     monkeypatch: Any) -> None:
    """Messages are in UTC whatever the local zone."""
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        engine = db.connect(sqlite_url)
        with engine.begin() as conn:
            locking.acquire(conn, ["node:gpu01", "node:gpu02"], 10, "carol", 2e9, 1e9)
            window = window_row(conn, "gpu[01-02]", 10)
            with pytest.raises(locking.LockConflict) as own:
                locking.acquire(conn, ["node:gpu02"], 20, "bob", 3e9, 1e9)
            locking.acquire(conn, ["node:gpu01"], 11, "bot", 3e9, 1e9, window_id=window)
            with pytest.raises(locking.LockConflict) as lent:
                locking.acquire(conn, ["node:gpu01"], 20, "bob", 3e9, 1e9)
            locking.acquire(conn, ["node:gpu09"], 12, "alice", 2e9, 1e9)
            with pytest.raises(locking.LockConflict) as held:
                locking.acquire(conn, ["node:gpu09"], 20, "bob", 3e9, 1e9)
        engine.dispose()
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    tail = (f": while it is open only the runbooks the window runs act on its nodes "
            f"(`window show {window}`; `window cancel {window}` closes it early)")
    shown = (f"maintenance window {window} (open on gpu[01-02] until 2030-01-01 01:00 UTC, "
             "created by carol)")
    assert str(own.value) == f"node:gpu02 is held by {shown}{tail}"
    assert str(lent.value) == (f"node:gpu01 is held by {shown}; lent now to its run, "
                               f"execution 11 (None){tail}")
    assert str(held.value).endswith("; it expires at 2033-05-18 03:33:20Z unless renewed")


def test_a_lock_expiring_now_is_taken_over_and_the_log_has_its_token(sqlite_url: str) -> None:
    engine = db.connect(sqlite_url)
    with engine.begin() as conn:
        assert locking.acquire(conn, [], 1, "alice", 100.0, 50.0) == 0  # nothing to take
        old = locking.acquire(conn, ["node:gpu01"], 1, "alice", 100.0, 50.0)
        assert locking.acquire(conn, ["node:gpu02"], 2, "bob", 100.0, 50.0) == old + 1
        new = locking.acquire(conn, ["node:gpu01"], 3, "carol", 300.0, 100.0)  # at its expiry
        assert (old, new) == (1, 3)  # a token counts the acquisitions
        assert logged(conn, "lock_taken_over") == [
            ("carol", {"lock": "node:gpu01", "from_execution": 1, "token": old}, 3)]
        assert locking.holds(conn, 4, 0, 0)  # an execution that needs no lock holds them all
    engine.dispose()


def test_acquiring_on_postgresql_takes_the_advisory_lock(sqlite_url: str) -> None:
    engine = db.connect(sqlite_url)
    with engine.begin() as conn:
        like = PostgresLike(conn)
        assert locking.acquire(like, ["node:gpu01"], 1, "alice", 2e9, 1e9) == 1  # type: ignore[arg-type]
        assert like.locks == ["select pg_advisory_xact_lock(:key)"]
        bound = text(like.locks[0]).bindparams(key=locking._PG_LOCKS_LOCK).compile(
            compile_kwargs={"literal_binds": True})
        assert str(bound).endswith(f"({0x6770_6C6B})")
    engine.dispose()


def test_a_window_over_releases_its_nodes_and_says_so(make_bot: BotFactory) -> None:
    bot = make_bot({"demo": runbook([record("a", "a")])})
    opened = bot.request("demo", {"node": "gpu04"}, "alice")
    with bot.db.begin() as conn:
        locking.acquire(conn, ["node:gpu02", "node:gpu01"], opened, "carol", 2e9, 1e9)
        window = window_row(conn, "gpu[01-02]", opened)
        assert locking.release_window(conn, window) == []  # its run has not ended yet
        conn.execute(executions.update().where(executions.c.id == opened)
                     .values(finished_at=now_iso()))
        released = locking.release_window(conn, window)
        assert sorted(released) == ["node:gpu01", "node:gpu02", "node:gpu04"]
        assert logged(conn, "locks_released") == [
            ("bot", {"window": window, "locks": ["node:gpu[01-02,04]"]}, opened)]
        assert rows(conn) == {}

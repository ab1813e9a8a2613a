"""The hash-chained audit log on SQLite and PostgreSQL: appends chain, verify names the first
edited, deleted, inserted or reordered event, concurrent writers keep one chain, export."""

from __future__ import annotations

import csv
import io
import itertools
import json
import threading

import pytest
from sqlalchemy import Engine, text

from bot.store import audit, db
from bot.store.words import Kind
from kit.canonical import canonical
from tests import postgres


def fill(engine: Engine, count: int) -> None:
    for number in range(count):
        with engine.begin() as conn:
            audit.append(conn, Kind.REQUESTED, "alice", {"n": number, "text": "ünïcode"},
                         execution_id=7)


def test_chain_verifies(db_url: str) -> None:
    engine = db.connect(db_url)
    fill(engine, 20)
    verdict = audit.verify(engine)
    assert verdict.ok and verdict.events == 20
    with engine.connect() as conn:
        rows = list(audit.events(conn))
    assert rows[0]["prev_hash"] == audit.GENESIS
    assert all(b["prev_hash"] == a["hash"] for a, b in itertools.pairwise(rows))
    assert verdict.head == rows[-1]["hash"]


def test_hash_is_sha256_of_canonical_json(sqlite_url: str) -> None:
    """An auditor can recompute a hash with any JSON library."""
    import hashlib

    engine = db.connect(sqlite_url)
    fill(engine, 1)
    with engine.connect() as conn:
        row = next(audit.events(conn))
    body = {k: row[k] for k in ("actor", "data", "execution_id", "kind", "prev_hash", "ts")}
    encoded = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert hashlib.sha256(encoded.encode()).hexdigest() == row["hash"]


def test_edit_is_named(db_url: str) -> None:
    engine = db.connect(db_url)
    fill(engine, 10)
    with engine.begin() as conn:
        conn.execute(text("UPDATE audit_events SET data = :d WHERE seq = 6"),
                     {"d": '{"n":999,"text":"forged"}'})
    verdict = audit.verify(engine)
    assert not verdict.ok
    assert verdict.seq == 6 and "event 6 was edited" in verdict.problem


def test_actor_edit_is_named(db_url: str) -> None:
    engine = db.connect(db_url)
    fill(engine, 5)
    with engine.begin() as conn:
        conn.execute(text("UPDATE audit_events SET actor = 'mallory' WHERE seq = 3"))
    assert audit.verify(engine).seq == 3


def test_delete_is_named(db_url: str) -> None:
    engine = db.connect(db_url)
    fill(engine, 10)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM audit_events WHERE seq = 4"))
    verdict = audit.verify(engine)
    assert not verdict.ok and verdict.seq == 4
    assert "event 4 deleted" in verdict.problem


def test_delete_and_renumber_is_named(db_url: str) -> None:
    """Hiding a deletion by renumbering still breaks the chain at that position."""
    engine = db.connect(db_url)
    fill(engine, 10)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM audit_events WHERE seq = 4"))
        for seq in range(5, 11):
            conn.execute(text("UPDATE audit_events SET seq = :new WHERE seq = :old"),
                         {"new": seq - 1, "old": seq})
    verdict = audit.verify(engine)
    assert not verdict.ok and verdict.seq == 4
    assert "does not follow event 3" in verdict.problem


def test_insert_is_named(db_url: str) -> None:
    """A forged event with a valid hash of its own, slipped in at position 5."""
    engine = db.connect(db_url)
    fill(engine, 8)
    with engine.begin() as conn:
        for seq in range(8, 4, -1):
            conn.execute(text("UPDATE audit_events SET seq = :new WHERE seq = :old"),
                         {"new": seq + 1, "old": seq})
        prev = conn.execute(text("SELECT hash FROM audit_events WHERE seq = 4")).scalar_one()
        data = canonical({"forged": True})
        ts = "2026-01-01T00:00:00.000000Z"
        conn.execute(text(
            "INSERT INTO audit_events (seq, ts, execution_id, kind, actor, data, prev_hash, hash)"
            " VALUES (5, :ts, NULL, 'approved', 'mallory', :data, :prev, :hash)"),
            {"ts": ts, "data": data, "prev": prev,
             "hash": audit.event_hash(ts, None, "approved", "mallory", data, prev)})
    verdict = audit.verify(engine)
    assert not verdict.ok and verdict.seq == 6
    assert "event 6 does not follow event 5" in verdict.problem


def test_reorder_is_named(db_url: str) -> None:
    engine = db.connect(db_url)
    fill(engine, 6)
    with engine.begin() as conn:
        conn.execute(text("UPDATE audit_events SET seq = 100 WHERE seq = 3"))
        conn.execute(text("UPDATE audit_events SET seq = 3 WHERE seq = 4"))
        conn.execute(text("UPDATE audit_events SET seq = 4 WHERE seq = 100"))
    verdict = audit.verify(engine)
    assert not verdict.ok and verdict.seq == 3


def test_concurrent_writers_keep_one_chain(db_url: str) -> None:
    engine = db.connect(db_url)
    errors: list[BaseException] = []

    def writer(name: str) -> None:
        try:
            worker_engine = db.connect(db_url, migrate=False)  # its own pool, like a process
            for number in range(25):
                with worker_engine.begin() as conn:
                    audit.append(conn, Kind.REQUESTED, name, {"n": number})
            worker_engine.dispose()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    verdict = audit.verify(engine)
    assert verdict.ok and verdict.events == 100


def test_export_jsonl_and_csv_with_window(sqlite_url: str) -> None:
    engine = db.connect(sqlite_url)
    fill(engine, 3)
    with engine.connect() as conn:
        stamps = [e["ts"] for e in audit.events(conn)]
        out = io.StringIO()
        assert audit.export(audit.events(conn, since=stamps[1]), out, "jsonl") == 2
        lines = [json.loads(line) for line in out.getvalue().splitlines()]
        assert [line["seq"] for line in lines] == [2, 3]
        out = io.StringIO()
        assert audit.export(audit.events(conn, until=stamps[1]), out, "csv") == 1
        rows = list(csv.DictReader(io.StringIO(out.getvalue())))
        assert rows[0]["kind"] == "requested" and json.loads(rows[0]["data"])["n"] == 0


@pytest.mark.postgres
def test_migrations_reach_head_on_postgres(postgres_server: postgres.PostgresServer) -> None:
    url = postgres.fresh_database(postgres_server.url, "migrations_check")
    engine = db.connect(url)
    assert db.current_revision(engine) == db.HEAD_REVISION
    db.upgrade(engine)  # a second time is a no-op
    assert db.current_revision(engine) == db.HEAD_REVISION

"""The hash-chained audit log on SQLite and PostgreSQL: appends chain, verify names the first
edited, deleted, inserted or reordered event, concurrent writers keep one chain, export."""

from __future__ import annotations

import csv
import io
import itertools
import json
import threading
from typing import Any

import pytest
from sqlalchemy import Engine, select, text

from bot.store import audit, db
from bot.store.schema import audit_events
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
    assert verdict.ok is False and verdict.seq == 4 and verdict.events == 3
    assert "does not follow event 3" in verdict.problem
    with engine.connect() as conn:
        third = conn.execute(text("SELECT hash FROM audit_events WHERE seq = 3")).scalar_one()
    assert verdict.head == third


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


def test_an_event_of_no_execution_hashes_null(sqlite_url: str) -> None:
    """The hash of an event outside any execution has ``"execution_id":null``."""
    import hashlib

    engine = db.connect(sqlite_url)
    with engine.begin() as conn:
        audit.append(conn, Kind.REQUESTED, "alice", {"n": 1})
    with engine.connect() as conn:
        row = next(audit.events(conn))
    body = {k: row[k] for k in ("actor", "data", "execution_id", "kind", "prev_hash", "ts")}
    assert body["execution_id"] is None
    encoded = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert hashlib.sha256(encoded.encode()).hexdigest() == row["hash"]


class PostgresLike:
    """A SQLite connection that says it is PostgreSQL and keeps the advisory lock it is asked
    for (compiled with its parameters, so a wrong name of one raises) instead of running it."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.dialect = type("Dialect", (), {"name": "postgresql"})()
        self.locks: list[str] = []

    def execute(self, statement: Any, params: Any = None) -> Any:
        if "advisory" in str(statement).lower():
            self.locks.append(str(statement.bindparams(**params)).lower())
            return None
        return self.conn.execute(statement, params)


def test_an_append_on_postgresql_takes_the_advisory_lock_first(sqlite_url: str) -> None:
    engine = db.connect(sqlite_url)
    with engine.begin() as conn:
        like = PostgresLike(conn)
        assert audit.append(like, Kind.REQUESTED, "alice", {"n": 1}) == 1  # type: ignore[arg-type]
        assert like.locks == ["select pg_advisory_xact_lock(:key)"]
        bound = text(like.locks[0]).bindparams(key=audit._PG_AUDIT_LOCK).compile(
            compile_kwargs={"literal_binds": True})
        assert str(bound).endswith(f"({0x6770_7562})")
    assert audit.verify(engine).ok


def test_events_of_one_execution_or_of_a_query_of_them(sqlite_url: str) -> None:
    engine = db.connect(sqlite_url)
    with engine.begin() as conn:
        for execution_id in (7, 8, 7, None, 9):
            audit.append(conn, Kind.REQUESTED, "alice", {}, execution_id=execution_id)
    with engine.connect() as conn:
        assert [e["seq"] for e in audit.events(conn, execution_id=7)] == [1, 3]
        of = select(audit_events.c.execution_id).where(audit_events.c.execution_id > 7)
        assert [e["seq"] for e in audit.events(conn, executions_of=of)] == [2, 5]


def test_events_come_in_chain_order_whatever_their_times(sqlite_url: str) -> None:
    """Read through the index on ts (a window), events still come by position."""
    engine = db.connect(sqlite_url)
    fill(engine, 4)
    with engine.begin() as conn:
        conn.execute(text("UPDATE audit_events SET ts = '2030-01-0' || (5 - seq)"))
    with engine.connect() as conn:
        assert [e["seq"] for e in audit.events(conn, since="2030")] == [1, 2, 3, 4]


def test_a_gap_of_several_events_is_named_with_the_verdict_before_it(db_url: str) -> None:
    engine = db.connect(db_url)
    fill(engine, 8)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM audit_events WHERE seq BETWEEN 4 AND 6"))
        third = conn.execute(text("SELECT hash FROM audit_events WHERE seq = 3")).scalar_one()
    verdict = audit.verify(engine)
    assert verdict == audit.Verdict(False, 3, third, "events 4-6 deleted (found 7 next)", 4)


def test_the_verdict_on_an_edit_or_a_break_keeps_the_last_good_head(db_url: str) -> None:
    engine = db.connect(db_url)
    fill(engine, 5)
    with engine.begin() as conn:
        second = conn.execute(text("SELECT hash FROM audit_events WHERE seq = 2")).scalar_one()
        conn.execute(text("UPDATE audit_events SET actor = 'mallory' WHERE seq = 3"))
    edited = audit.verify(engine)
    assert (edited.ok, edited.events, edited.head) == (False, 2, second)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM audit_events WHERE seq >= 3"))
        conn.execute(text("UPDATE audit_events SET prev_hash = :p WHERE seq = 2"),
                     {"p": "f" * 64})
    broken = audit.verify(engine)
    assert broken.ok is False and (broken.events, broken.seq) == (1, 2)
    assert broken.head != second and "was edited" in broken.problem


def test_times_are_read_as_utc(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the local zone: a time with a zone is turned into UTC, one without is UTC."""
    import time

    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        assert audit.moment(" 2026-11-30T12:30:00.5+02:00 ") == "2026-11-30T10:30:00.500000Z"
        assert audit.moment("2026-11-30T10:00:00") == "2026-11-30T10:00:00.000000Z"
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert audit.moment("2026-11-30T10:00:00Z") == "2026-11-30T10:00:00.000000Z"
    assert audit.moment("2026-11-30") == "2026-11-30T00:00:00.000000Z"
    with pytest.raises(ValueError):
        audit.moment("yesterday")


def test_the_previous_driver_version_is_the_last_change_that_changed(sqlite_url: str) -> None:
    engine = db.connect(sqlite_url)
    with engine.connect() as conn:
        assert audit.previous_driver_version(conn) is None
    finished: list[tuple[Kind, dict[str, Any]]] = [
        (Kind.STEP_FINISHED, {"details": {"previous_version": "535.1"}}),
        (Kind.STEP_FINISHED, {"details": {"previous_version": "550.54"}}),
        (Kind.STEP_FINISHED, {"details": {"previous_version": "560.1"}, "changed": False}),
        (Kind.REQUESTED, {"details": {"previous_version": "999"}}),
        (Kind.STEP_FINISHED, {"details": {}, "note": "previous_version"}),
    ]
    with engine.begin() as conn:
        for kind, data in finished:
            audit.append(conn, kind, "bot", data, execution_id=1)
    with engine.connect() as conn:
        assert audit.previous_driver_version(conn) == "550.54"


def test_a_long_export_is_counted_across_its_pieces(sqlite_url: str) -> None:
    engine = db.connect(sqlite_url)
    with engine.begin() as conn:
        for number in range(40):
            audit.append(conn, Kind.REQUESTED, "alice", {"n": number, "pad": "x" * 4000})
    with engine.connect() as conn:
        out = io.StringIO()
        assert audit.export(audit.events(conn), out, "jsonl") == 40
        assert [json.loads(line)["data"]["n"] for line in out.getvalue().splitlines()] == (
            list(range(40)))


def test_a_piece_ends_as_soon_as_it_holds_64_kib() -> None:
    """A row that fills the buffer to exactly 65536 characters ends a piece of its own."""
    row = {"data": "x" * (65536 - len('{"data":""}\n'))}
    assert len(canonical(row) + "\n") == 65536
    pieces = list(audit.lines(iter([row, {"data": "y"}]), "jsonl"))
    assert pieces == [(canonical(row) + "\n", 1), ('{"data":"y"}\n', 1)]
    assert list(audit.lines(iter([]), "jsonl")) == []


def test_an_empty_csv_export_still_has_its_header() -> None:
    out = io.StringIO()
    assert audit.export(iter([]), out, "csv") == 0
    assert out.getvalue().strip() == ",".join(audit.EXPORT_FIELDS)


def test_an_unproven_start_is_the_verdict_before_any_event(sqlite_url: str,
                                                          tmp_path: Any) -> None:
    from tests.bot.store import test_audit_chain_start as start

    log = start.archived_log(db.connect(sqlite_url), tmp_path)
    start.truncated_tail(log)
    assert audit.verify(log.engine) == audit.Verdict(
        False, 0, log.hashes[5], "the log starts after an archive of events 1-5 that no "
        "audit_archived event in the log records: events 1-5 were deleted, not archived, as "
        "far as the log shows", 6)


def test_a_record_without_some_fields_is_named_with_them(sqlite_url: str,
                                                         tmp_path: Any) -> None:
    from tests.bot.store import test_audit_chain_start as start

    log = start.archived_log(db.connect(sqlite_url), tmp_path)
    recorded = start.record(log)
    start.recompute_from(log.engine, 9, canonical(
        {k: v for k, v in recorded.items() if k not in ("file", "sha256")}))
    assert audit.verify(log.engine).problem == (
        "the archive of events 1-5 the log starts after is not the one its audit_archived "
        "event 9 records (file, sha256 differ; the event has no file, sha256)")


def test_records_are_the_archived_events_that_can_be_read(sqlite_url: str,
                                                          tmp_path: Any) -> None:
    from tests.bot.store import test_audit_chain_start as start

    log = start.archived_log(db.connect(sqlite_url), tmp_path)
    recorded = start.record(log)
    with log.engine.begin() as conn:
        for seq, data in ((100, "not json"), (101, '["a list"]'), (102, '{"x":1}')):
            conn.execute(text(
                "INSERT INTO audit_events (seq, ts, execution_id, kind, actor, data, prev_hash,"
                " hash) VALUES (:s, 't', NULL, 'audit_archived', 'mallory', :d, 'p', 'h')"),
                {"s": seq, "d": data})
        assert audit.records(conn) == [(9, "auditor", recorded),
                                       (102, "mallory", {"x": 1})]


@pytest.mark.postgres
def test_migrations_reach_head_on_postgres(postgres_server: postgres.PostgresServer) -> None:
    url = postgres.fresh_database(postgres_server.url, "migrations_check")
    engine = db.connect(url)
    assert db.current_revision(engine) == db.HEAD_REVISION
    db.upgrade(engine)  # a second time is a no-op
    assert db.current_revision(engine) == db.HEAD_REVISION

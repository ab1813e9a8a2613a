"""The append-only, hash-chained audit log: ``append`` (inside the caller's transaction),
``verify``, and reading and exporting events.

Nothing here updates or deletes an event, and nothing else writes the table.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

from sqlalchemy import Connection, Engine, Select, select, text

from bot.store.db import now_iso
from bot.store.schema import audit_archives, audit_events
from bot.store.words import Kind
from kit.canonical import canonical

GENESIS = "0" * 64
_PG_AUDIT_LOCK = 0x6770_7562  # advisory lock key: serialises appends on PostgreSQL
STREAM_BATCH = 1000  # events read from the database at a time by ``events``
EXPORT_FIELDS = ["seq", "ts", "execution_id", "kind", "actor", "data", "prev_hash", "hash"]
def event_hash(
    ts: str, execution_id: int | None, kind: str, actor: str, data_json: str, prev_hash: str
) -> str:
    """sha256 of the event's canonical JSON, built without re-encoding ``data``::

        {"actor":…,"data":{…},"execution_id":…,"kind":…,"prev_hash":…,"ts":…}

    (keys sorted, no spaces, UTF-8), so anyone can recompute the chain with any JSON
    library. ``prev_hash`` is the hash of the event before it (``GENESIS`` for the first).
    """
    body = (
        '{"actor":' + canonical(actor) + ',"data":' + data_json
        + ',"execution_id":' + ("null" if execution_id is None else str(execution_id))
        + ',"kind":' + canonical(kind) + ',"prev_hash":"' + prev_hash + '","ts":"' + ts + '"}'
    )
    return hashlib.sha256(body.encode()).hexdigest()


def append(
    conn: Connection,
    kind: Kind,
    actor: str,
    data: Mapping[str, Any],
    execution_id: int | None = None,
) -> int:
    """Append one event inside the caller's transaction; returns its position.

    Appends are serialised (SQLite: the writer lock taken by BEGIN IMMEDIATE; PostgreSQL: a
    transaction-scoped advisory lock) and happen in the same transaction as the state change
    they describe, so the log and the state never disagree.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_AUDIT_LOCK})
    found = last(conn)
    seq, prev = (found[0] + 1, found[1]) if found else (1, GENESIS)
    ts = now_iso()
    data_json = canonical(dict(data))
    conn.execute(_INSERT, {
        "seq": seq, "ts": ts, "execution_id": execution_id, "kind": kind, "actor": actor,
        "data": data_json, "prev_hash": prev,
        "hash": event_hash(ts, execution_id, kind, actor, data_json, prev),
    })
    return seq


# built once: every append runs them (a statement built per call costs more than the write)
_INSERT = audit_events.insert()
_LAST = select(audit_events.c.seq, audit_events.c.hash).order_by(
    audit_events.c.seq.desc()).limit(1)


def last(conn: Connection) -> tuple[int, str] | None:
    """The log's last event in the database: (position, hash); None when there is none."""
    row = conn.execute(_LAST).first()
    return None if row is None else (int(row[0]), str(row[1]))


@dataclass(frozen=True)
class Verdict:
    ok: bool
    events: int
    head: str
    problem: str = ""
    seq: int | None = None  # the first event that is wrong


def verify(engine: Engine, batch: int = 10_000) -> Verdict:
    """Walk the whole chain; report the first edited, deleted, inserted or reordered event.
    It starts after the latest archive, if any (``start``), once that archive is proven by
    its audit_archived event in the chain (``start_problem``).

    ``seq`` is only the position; it is not hashed, so an edited event (its own hash is
    wrong) is told from a deleted, inserted or reordered one (the chain breaks between two
    events, or a position is missing).
    """
    with engine.connect() as conn:
        expected_seq, prev = start(conn)
        unproven = start_problem(conn)
    if unproven:  # what the log rests on is not proven: nothing after it can stand for it
        return Verdict(False, 0, prev, unproven, expected_seq)
    count = 0
    with engine.connect() as conn:
        raw = conn.connection.driver_connection
        assert raw is not None
        cursor = raw.cursor()
        cursor.execute(
            "SELECT seq, ts, execution_id, kind, actor, data, prev_hash, hash "
            "FROM audit_events ORDER BY seq"
        )
        while rows := cursor.fetchmany(batch):
            for seq, ts, execution_id, kind, actor, data, prev_hash, stored in rows:
                if seq != expected_seq:
                    missing = f"event {expected_seq}" if seq == expected_seq + 1 else (
                        f"events {expected_seq}-{seq - 1}"
                    )
                    return Verdict(False, count, prev, f"{missing} deleted (found {seq} next)",
                                   expected_seq)
                if event_hash(ts, execution_id, kind, actor, data, prev_hash) != stored:
                    return Verdict(False, count, prev,
                                   f"event {seq} was edited: its content does not match its hash",
                                   seq)
                if prev_hash != prev:
                    return Verdict(False, count, prev,
                                   f"event {seq} does not follow event {seq - 1}: an event was "
                                   f"deleted, inserted or reordered at position {seq}", seq)
                prev, expected_seq, count = stored, seq + 1, count + 1
        cursor.close()
    return Verdict(True, count, prev)


def start(conn: Connection) -> tuple[int, str]:
    """Where the log in the database starts: (1, GENESIS), or after the latest archive
    (bot.store.archive): its last position + 1, chained to its head hash."""
    row = conn.execute(select(audit_archives.c.up_to_seq, audit_archives.c.head_hash)
                       .order_by(audit_archives.c.up_to_seq.desc()).limit(1)).first()
    return (1, GENESIS) if row is None else (int(row[0]) + 1, str(row[1]))


ARCHIVE_FIELDS = ("from_seq", "up_to_seq", "head_hash", "file", "sha256")


def start_problem(conn: Connection) -> str:
    """Why the log's start is not proven; "" when it is. The archive the log starts after
    counts only with its audit_archived event still in the log, holding the same events,
    head hash, file and sha256: a row alone is what someone who deletes the log's beginning
    would write."""
    row = conn.execute(select(audit_archives).order_by(audit_archives.c.up_to_seq.desc())
                       .limit(1)).mappings().first()
    if row is None:
        return ""
    span = f"events {row['from_seq']}-{row['up_to_seq']}"
    found = [(seq, data) for seq, _, data in records(conn)
             if data.get("up_to_seq") == row["up_to_seq"]]
    if not found:
        return (f"the log starts after an archive of {span} that no audit_archived event in "
                f"the log records: {span} were deleted, not archived, as far as the log shows")
    if any(all(data.get(name) == row[name] for name in ARCHIVE_FIELDS) for _, data in found):
        return ""
    seq, data = found[-1]
    wrong = [name for name in ARCHIVE_FIELDS if data.get(name) != row[name]]
    missing = [name for name in wrong if name not in data]
    return (f"the archive of {span} the log starts after is not the one its audit_archived "
            f"event {seq} records ({', '.join(wrong)} differ"
            + (f"; the event has no {', '.join(missing)}" if missing else "") + ")")


def records(conn: Connection) -> list[tuple[int, str, dict[str, Any]]]:
    """The audit_archived events in the database, oldest first: (position, actor, data)."""
    found = []
    for seq, actor, data in conn.execute(
            select(audit_events.c.seq, audit_events.c.actor, audit_events.c.data)
            .where(audit_events.c.kind == Kind.AUDIT_ARCHIVED).order_by(audit_events.c.seq)):
        try:
            parsed = json.loads(data)
        except ValueError:
            continue  # an edited event: verify names it
        if isinstance(parsed, dict):
            found.append((int(seq), str(actor), parsed))
    return found


def events(
    conn: Connection,
    *,
    since: str | None = None,
    until: str | None = None,
    execution_id: int | None = None,
    executions_of: Select[Any] | None = None,
) -> Iterator[dict[str, Any]]:
    """Events in chain order, read as they are used (a server-side cursor on PostgreSQL), so
    that exporting millions of them holds one batch in memory. ``executions_of``: only the
    events of the executions this query of execution IDs selects."""
    columns = [audit_events.c[name] for name in EXPORT_FIELDS]
    query = select(*columns).order_by(audit_events.c.seq)
    if since:
        query = query.where(audit_events.c.ts >= since)
    if until:
        query = query.where(audit_events.c.ts < until)
    if execution_id is not None:
        query = query.where(audit_events.c.execution_id == execution_id)
    if executions_of is not None:
        query = query.where(audit_events.c.execution_id.in_(executions_of))
    streamed = query.execution_options(stream_results=True, yield_per=STREAM_BATCH)
    for seq, ts, execution_id, kind, actor, data, prev_hash, hash_ in conn.execute(streamed):
        yield {"seq": seq, "ts": ts, "execution_id": execution_id, "kind": kind,
               "actor": actor, "data": json.loads(data), "prev_hash": prev_hash,
               "hash": hash_}  # unpacked tuples: cheaper than row mappings, per event


def moment(value: str) -> str:
    """An ISO date or time as the log stores times (UTC, ``2026-11-30T10:00:00.000000Z``);
    a time without a zone is UTC. ValueError when ``value`` is not one."""
    found = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    if found.tzinfo is not None:
        found = found.astimezone(UTC)
    return found.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def previous_driver_version(conn: Connection) -> str | None:
    """The driver version before the last successful gpu_operator.set_driver_version change."""
    rows = conn.execute(
        select(audit_events.c.data)
        .where(audit_events.c.kind == Kind.STEP_FINISHED,
               audit_events.c.data.like('%"previous_version"%'))
        .order_by(audit_events.c.seq.desc())
    )
    for (data,) in rows:
        details = json.loads(data).get("details") or {}
        if details.get("previous_version") and json.loads(data).get("changed", True):
            return str(details["previous_version"])
    return None


def export(rows: Iterator[dict[str, Any]], out: TextIO, fmt: str) -> int:
    """Write events as JSON lines or CSV; returns how many."""
    count = 0
    for piece, counted in lines(rows, fmt):
        out.write(piece)
        count += counted
    return count


def lines(rows: Iterator[dict[str, Any]], fmt: str) -> Iterator[tuple[str, int]]:
    """The export's text in pieces of about 64 KiB, each with how many events it holds: the
    one format of ``runbook audit export`` and the console's downloads."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=EXPORT_FIELDS) if fmt == "csv" else None
    if writer is not None:
        writer.writeheader()
    count = 0
    for row in rows:
        if writer is None:
            buffer.write(canonical(row) + "\n")
        else:
            writer.writerow({**row, "data": canonical(row["data"])})
        count += 1
        if buffer.tell() >= 65536:
            yield buffer.getvalue(), count
            buffer.seek(0)
            buffer.truncate()
            count = 0
    if buffer.tell() or count:
        yield buffer.getvalue(), count



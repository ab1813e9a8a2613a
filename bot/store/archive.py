"""Retention: ``archive`` moves the events before a date out of the log into a file, checked
before anything is deleted; the log then starts after them, chained to the archive's head
hash (bot.store.audit.start), and an ``audit_archived`` event says where they went.
``verify_file`` proves an archive file on its own; ``read_proven`` also returns what the
checkpoints need of it (bot.store.checkpoints proves archived events with it).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, delete, func, select

from bot.store import audit
from bot.store.db import now_iso
from bot.store.schema import audit_archives, audit_events
from bot.store.words import Kind

FORMAT = "gpu-runbook-bot audit archive 1"


class ArchiveError(Exception):
    """Nothing was archived (or the file does not prove itself); the message says why."""


@dataclass(frozen=True)
class Archived:
    from_seq: int
    up_to_seq: int
    head_hash: str
    sha256: str  # of the file
    file: Path


@dataclass(frozen=True)
class Contents:
    """A proven archive file and what ``read_proven`` was asked to keep of it."""

    archived: Archived
    prev_hash: str  # the hash its first event is chained to
    hashes: dict[int, str]  # of the positions asked for that it holds
    records: list[tuple[int, str, dict[str, Any]]]  # its audit_archived events: seq, actor, data


def archive(engine: Engine, before: str, out: Path, actor: str) -> Archived:
    """Move the events older than ``before`` (ISO time) into ``out``, which must not exist."""
    verdict = audit.verify(engine)
    if not verdict.ok:
        raise ArchiveError(f"the audit log is broken ({verdict.problem}): nothing archived")
    if out.exists():
        raise ArchiveError(f"{out} exists: name a new file")
    out = out.absolute()  # its audit_archived event names it wherever the check runs from
    with engine.connect() as conn:
        from_seq, prev = audit.start(conn)
        up_to = conn.execute(select(func.max(audit_events.c.seq))
                             .where(audit_events.c.ts < before)).scalar()
        if up_to is None:
            raise ArchiveError(f"no event in the log is older than {before}")
        rows = conn.execute(select(audit_events).where(audit_events.c.seq <= up_to)
                            .order_by(audit_events.c.seq)).mappings().all()
    head = str(rows[-1]["hash"])
    _write(out, {"format": FORMAT, "from_seq": from_seq, "up_to_seq": up_to,
                 "prev_hash": prev, "head_hash": head}, rows)
    proved = verify_file(out)
    if (proved.up_to_seq, proved.head_hash) != (up_to, head):
        raise ArchiveError(f"{out} does not read back as written: nothing archived")
    with engine.begin() as conn:
        _move(conn, proved, actor)
    return proved


def _move(conn: Connection, proved: Archived, actor: str) -> None:
    """Record the archive, say so in the log, then delete what the file holds: all in one
    transaction (the new event is chained to the last one before the delete)."""
    expected = proved.up_to_seq - proved.from_seq + 1
    present = conn.execute(select(func.count()).select_from(audit_events).where(
        audit_events.c.seq.between(proved.from_seq, proved.up_to_seq))).scalar_one()
    if present != expected:
        raise ArchiveError("another archive moved these events a moment ago: nothing archived")
    conn.execute(audit_archives.insert().values(
        from_seq=proved.from_seq, up_to_seq=proved.up_to_seq, head_hash=proved.head_hash,
        file=str(proved.file), sha256=proved.sha256, created_at=now_iso(), created_by=actor))
    audit.append(conn, Kind.AUDIT_ARCHIVED, actor, {
        "from_seq": proved.from_seq, "up_to_seq": proved.up_to_seq,
        "head_hash": proved.head_hash, "file": str(proved.file), "sha256": proved.sha256})
    conn.execute(delete(audit_events).where(audit_events.c.seq <= proved.up_to_seq))


def _write(out: Path, header: dict[str, Any], rows: Any) -> None:
    partial = out.with_name(out.name + ".partial")
    try:
        with partial.open("x", encoding="utf-8") as file:
            file.write(json.dumps(header, sort_keys=True) + "\n")
            for row in rows:
                file.write(json.dumps({key: row[key] for key in (
                    "seq", "ts", "execution_id", "kind", "actor", "data", "prev_hash",
                    "hash")}, sort_keys=True) + "\n")
            file.flush()
            os.fsync(file.fileno())
        partial.rename(out)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise ArchiveError(f"cannot write {out}: {exc.strerror}") from exc


def verify_file(path: Path) -> Archived:
    """Prove an archive file: its events chain from its ``prev_hash`` to its ``head_hash``,
    every hash recomputed; ArchiveError naming the first line that does not."""
    return read_proven(path).archived


def read_proven(path: Path, positions: frozenset[int] = frozenset()) -> Contents:
    """``verify_file``, keeping the hashes of ``positions`` and the audit_archived events the
    file holds (the records of older archives)."""
    try:
        raw = path.read_bytes()
        lines = raw.decode("utf-8").splitlines()
        header = json.loads(lines[0])
    except (OSError, UnicodeDecodeError, ValueError, IndexError) as exc:
        raise ArchiveError(f"{path} is not an audit archive: {exc}") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ArchiveError(f"{path} is not an audit archive (no {FORMAT!r} header)")
    try:
        seq, prev = int(header["from_seq"]), str(header["prev_hash"])
    except (KeyError, TypeError, ValueError):
        raise ArchiveError(f"{path}: its header has no from_seq and prev_hash") from None
    hashes: dict[int, str] = {}
    records: list[tuple[int, str, dict[str, Any]]] = []
    for number, line in enumerate(lines[1:], 2):
        try:
            event = json.loads(line)
            digest = audit.event_hash(event["ts"], event["execution_id"], event["kind"],
                                      event["actor"], event["data"], event["prev_hash"])
            record = json.loads(event["data"]) if event["kind"] == Kind.AUDIT_ARCHIVED else None
        except (ValueError, KeyError, TypeError):
            raise ArchiveError(f"{path}, line {number}: not an event") from None
        if event["seq"] != seq or event["prev_hash"] != prev or digest != event["hash"]:
            raise ArchiveError(f"{path}, line {number}: event {event['seq']} does not prove "
                               "itself (edited, missing or out of order)")
        if seq in positions:
            hashes[seq] = digest
        if isinstance(record, dict):
            records.append((seq, str(event["actor"]), record))
        seq, prev = seq + 1, digest
    if (seq - 1, prev) != (header.get("up_to_seq"), header.get("head_hash")):
        raise ArchiveError(f"{path} ends at event {seq - 1}, not at the "
                           f"{header.get('up_to_seq')} its header says")
    proved = Archived(int(header["from_seq"]), seq - 1, prev, hashlib.sha256(raw).hexdigest(),
                      path)
    return Contents(proved, str(header["prev_hash"]), hashes, records)

"""Checkpoints of the audit log outside the database: its head (position and hash) appended
now and then to a file. The hash chain proves that no event inside the log was edited; only
a record kept elsewhere proves that its tail was not cut off or written again with hashes
recomputed. ``record`` adds one, ``check`` compares the log with all of them, and an
archived event's with the archive file that holds it (proven back to the log's start).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, select

from bot.store import archive, audit
from bot.store.db import now_iso
from bot.store.schema import audit_archives, audit_events


@dataclass(frozen=True)
class Checkpoint:
    seq: int  # the last event's position then (0: the log was empty)
    hash: str  # its hash
    ts: str  # when it was recorded


class CheckpointError(Exception):
    """The checkpoint file cannot be read or written; the message says which and why."""


def head(engine: Engine) -> tuple[int, str]:
    """The log's last event: (position, hash); (0, "") when it is empty."""
    with engine.connect() as conn:
        return audit.last(conn) or (0, "")


def record(engine: Engine, path: Path) -> Checkpoint | None:
    """Append the log's head to ``path`` (one JSON line, flushed to disk), unless the last
    checkpoint there already has it; returns what was written, or None."""
    seq, digest = head(engine)
    known = read(path) if path.exists() else []
    if known and (known[-1].seq, known[-1].hash) == (seq, digest):
        return None
    point = Checkpoint(seq, digest, now_iso())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as out:
            out.write(as_line(point) + "\n")
            out.flush()
            os.fsync(out.fileno())
    except OSError as exc:
        raise CheckpointError(f"cannot write the audit checkpoint file {path}: "
                              f"{exc.strerror}") from exc
    return point


def as_line(point: Checkpoint) -> str:
    """One checkpoint as the file holds it (and as the chat shows it, so that lines copied
    from the channel's history make a file ``check`` reads)."""
    return json.dumps({"seq": point.seq, "hash": point.hash, "ts": point.ts})


def read(path: Path) -> list[Checkpoint]:
    """Every checkpoint in ``path``, in order; CheckpointError naming the first bad line.
    Blank lines are passed over, and text around a line's ``{...}`` (a chat message's words,
    pasted from the channel) is not read."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"cannot read the audit checkpoint file {path}: "
                              f"{getattr(exc, 'strerror', None) or 'not text'}") from exc
    found = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line[line.find("{"):line.rfind("}") + 1] if "{" in line else line)
            point = Checkpoint(int(data["seq"]), str(data["hash"]), str(data["ts"]))
        except (ValueError, KeyError, TypeError):
            raise CheckpointError(f"{path}, line {number}: not a checkpoint "
                                  '({"seq": N, "hash": "...", "ts": "..."})') from None
        found.append(point)
    return found


def check(engine: Engine, path: Path) -> tuple[int, list[str]]:
    """How many checkpoints ``path`` holds, and what the log contradicts in them: an event a
    checkpoint saw that is gone (the tail was cut off) or has another hash now (written
    again), or an archived one its archive file does not prove (``_archived``). The chain
    itself is audit.verify's to check."""
    points = read(path)
    problems: list[str] = []
    last, _ = head(engine)
    with engine.connect() as conn:
        first, _ = audit.start(conn)
        archived = {int(seq): str(digest) for seq, digest in conn.execute(
            select(audit_archives.c.up_to_seq, audit_archives.c.head_hash))}
        for point in points:
            if point.seq == 0 or (point.seq < first and point.seq not in archived):
                continue  # an empty log, or an event inside an archive (verify_file's)
            stored = archived.get(point.seq) if point.seq < first else conn.execute(
                select(audit_events.c.hash).where(audit_events.c.seq == point.seq)).scalar()
            if stored is None:
                problems.append(f"the checkpoint of {point.ts} saw event {point.seq}, but the "
                                f"log ends at event {last}: its tail was cut off")
            elif stored != point.hash:
                problems.append(f"event {point.seq} is not the one the checkpoint of "
                                f"{point.ts} saw (hash {point.hash[:12]}…, now "
                                f"{stored[:12]}…): the log was written again from there")
        problems += _archived(conn, [point for point in points if 0 < point.seq < first])
    return len(points), problems


def _archived(conn: Connection, below: list[Checkpoint]) -> list[str]:
    """Checkpoints of archived events, each against the file that holds it: from the head
    the log in the database continues from, back one archive at a time, each found by its
    audit_archived event (in the log, or in a newer archive file already proven) and its
    file proven by that event's sha256, its own chain and the head it ends at."""
    first = conn.execute(select(audit_events.c.seq, audit_events.c.prev_hash)
                         .order_by(audit_events.c.seq).limit(1)).first()
    if first is not None:
        up_to, head_hash = int(first[0]) - 1, str(first[1])
    else:  # an empty log after an archive: its own audit_archived event is gone too
        seq, head_hash = audit.start(conn)
        up_to = seq - 1
    known = audit.records(conn)
    problems: list[str] = []
    while below:
        found = next(((seq, data) for seq, _, data in reversed(known)
                      if (data.get("up_to_seq"), data.get("head_hash")) == (up_to, head_hash)),
                     None)
        if found is None:
            return [*problems, (
                f"{len(below)} checkpoint(s) of events before event {up_to + 1} cannot be "
                f"proven: the log continues from event {up_to} (hash {head_hash[:12]}…), but "
                "no audit_archived event records an archive ending there (events deleted, "
                "the archive made up)")]
        contents, problem = _proven(*found, frozenset(point.seq for point in below))
        if contents is None:
            return [*problems, problem]
        start = contents.archived.from_seq
        for point in below:
            if point.seq >= start:
                problems += _against_file(point, contents)
        known += contents.records
        below = [point for point in below if point.seq < start]
        up_to, head_hash = start - 1, contents.prev_hash
    return problems


def _proven(seq: int, data: dict[str, Any],
            positions: frozenset[int]) -> tuple[archive.Contents | None, str]:
    """The archive file an audit_archived event records, proven; else why it is not."""
    name = (f"the archive of events {data.get('from_seq')}-{data.get('up_to_seq')} "
            f"(audit_archived event {seq})")
    file, sha256 = data.get("file"), data.get("sha256")
    if not isinstance(file, str) or not isinstance(sha256, str):
        return None, f"{name} does not name its file and sha256: it cannot be proven"
    path = Path(file)
    if not path.is_file():
        return None, f"{name} cannot be proven: its file {file} is missing"
    try:
        contents = archive.read_proven(path, positions)
    except archive.ArchiveError as exc:
        return None, f"{name} cannot be proven: {exc}"
    got = contents.archived
    if got.from_seq > got.up_to_seq:  # an empty archive would be walked past forever
        return None, f"{name} cannot be proven: {file} holds no events"
    if got.sha256 != sha256:
        return None, (f"{name} cannot be proven: {file} is not the file archived (sha256 "
                      f"{got.sha256[:12]}…, recorded {sha256[:12]}…)")
    if (got.from_seq, got.up_to_seq, got.head_hash) != (
            data.get("from_seq"), data.get("up_to_seq"), data.get("head_hash")):
        return None, (f"{name} cannot be proven: {file} holds events {got.from_seq}-"
                      f"{got.up_to_seq} ending at hash {got.head_hash[:12]}…, not those "
                      "its event records")
    return contents, ""


def _against_file(point: Checkpoint, contents: archive.Contents) -> list[str]:
    stored, file = contents.hashes.get(point.seq), contents.archived.file
    if stored is None:
        return [f"the checkpoint of {point.ts} saw event {point.seq}, which the archive "
                f"{file} that should hold it does not"]
    if stored != point.hash:
        return [f"event {point.seq} is not the one the checkpoint of {point.ts} saw (hash "
                f"{point.hash[:12]}…, archived in {file} as {stored[:12]}…): the log was "
                "written again from there before it was archived"]
    return []

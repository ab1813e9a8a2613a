"""Checkpoints of the audit log outside the database: its head (position and hash) appended
now and then to a file. The hash chain proves that no event inside the log was edited; only
a record kept elsewhere proves that its tail was not cut off or written again with hashes
recomputed. ``record`` adds one, ``check`` compares the log with all of them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, select

from bot.store import audit
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
    again). The chain itself is audit.verify's to check."""
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
    return len(points), problems

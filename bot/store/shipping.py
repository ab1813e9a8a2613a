"""Cursors of the audit log's destinations (table audit_cursors): how far each receiver
has accepted the log, and the events that follow. A cursor moves only by compare-and-set,
and only over events its receiver accepted, so a crash can resend but never skip.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, func, select, update
from sqlalchemy.exc import IntegrityError

from adapters.auditlog import Event
from bot.store import audit
from bot.store.db import now_iso
from bot.store.schema import audit_archives, audit_cursors, audit_events


@dataclass(frozen=True)
class Cursor:
    destination: str
    seq: int  # the last event the destination accepted; 0: none yet
    hash: str  # its hash ("" for none)
    skipped: int  # events that were gone (archived, deleted) before they could be shipped
    rejected: int  # records the destination accepted but said it dropped


def cursor(engine: Engine, destination: str) -> Cursor:
    """The destination's cursor; a new destination starts before the log's first event."""
    query = select(audit_cursors).where(audit_cursors.c.destination == destination)
    with engine.connect() as conn:
        row = conn.execute(query).mappings().first()
    if row is None:
        try:
            with engine.begin() as conn:
                conn.execute(audit_cursors.insert().values(
                    destination=destination, seq=0, hash="", updated_at=now_iso(), skipped=0,
                    rejected=0))
        except IntegrityError:  # another replica made it a moment ago
            pass
        with engine.connect() as conn:
            row = conn.execute(query).mappings().one()
    return Cursor(row["destination"], int(row["seq"]), str(row["hash"]), int(row["skipped"]),
                  int(row["rejected"]))


def move(engine: Engine, was: Cursor, seq: int, digest: str, *, skipped: int = 0,
         rejected: int = 0) -> bool:
    """Set the cursor to event ``seq`` unless it moved since ``was`` was read (another
    replica leading a moment ago); whether it was set."""
    with engine.begin() as conn:
        done = conn.execute(update(audit_cursors).where(
            audit_cursors.c.destination == was.destination, audit_cursors.c.seq == was.seq,
            audit_cursors.c.hash == was.hash).values(
            seq=seq, hash=digest, updated_at=now_iso(),
            skipped=audit_cursors.c.skipped + skipped,
            rejected=audit_cursors.c.rejected + rejected))
        return bool(done.rowcount == 1)


def following(engine: Engine, seq: int, limit: int) -> list[Event]:
    """Up to ``limit`` events after position ``seq``, in chain order."""
    with engine.connect() as conn:
        rows = conn.execute(select(audit_events).where(audit_events.c.seq > seq)
                            .order_by(audit_events.c.seq).limit(limit)).mappings().all()
    return [Event(int(r["seq"]), r["ts"], r["execution_id"], r["kind"], r["actor"], r["data"],
                  r["prev_hash"], r["hash"]) for r in rows]


def head(engine: Engine) -> tuple[int, str]:
    """The log's last event: (position, hash); (0, "") when the table is empty."""
    with engine.connect() as conn:
        return audit.last(conn) or (0, "")


def archived_through(engine: Engine) -> int:
    """The last position moved out into an archive file (0: none)."""
    with engine.connect() as conn:
        return int(conn.execute(select(func.max(audit_archives.c.up_to_seq))).scalar() or 0)


def all_cursors(engine: Engine) -> list[Cursor]:
    with engine.connect() as conn:
        rows = conn.execute(select(audit_cursors).order_by(audit_cursors.c.destination))
        return [Cursor(r.destination, int(r.seq), str(r.hash), int(r.skipped),
                       int(r.rejected)) for r in rows]

"""Each audit event's place in the chain, checked one by one for a page: its hash recomputed
from its stored content, and its link to the event before it (which may belong to another
execution, and is fetched). Reads only; bot.store.audit.verify walks the whole chain."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bot.store import audit, queries
from bot.store.db import Connection


@dataclass(frozen=True)
class Mark:
    ok: bool
    text: str  # "verified", or what is wrong, in words


def marks(conn: Connection, rows: Iterable[Mapping[str, Any]]) -> dict[int, Mark]:
    """seq -> Mark for stored events (rows of audit_events, ``data`` as stored: the JSON
    text the hash covers)."""
    rows = list(rows)
    first, first_prev = audit.start(conn)
    wanted = sorted({int(row["seq"]) - 1 for row in rows} - {first - 1})
    before = queries.hashes(conn, wanted)
    before[first - 1] = first_prev
    return {int(row["seq"]): _mark(row, before) for row in rows}


def _mark(row: Mapping[str, Any], before: Mapping[int, str]) -> Mark:
    seq = int(row["seq"])
    try:
        digest = audit.event_hash(row["ts"], row["execution_id"], row["kind"], row["actor"],
                                  row["data"], row["prev_hash"])
    except (TypeError, ValueError):
        digest = ""
    if digest != row["hash"]:
        return Mark(False, "edited: hash does not match its content")
    if seq - 1 not in before:
        return Mark(False, f"event {seq - 1} before it is missing: deleted")
    if before[seq - 1] != row["prev_hash"]:
        return Mark(False, f"chain broken: it does not follow event {seq - 1} (inserted, "
                           "deleted or reordered)")
    return Mark(True, "verified")

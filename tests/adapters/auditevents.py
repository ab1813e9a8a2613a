"""Audit events for the shipping tests: a real chain (bot.store.audit's hashes), built
without a database."""

from __future__ import annotations

from adapters.auditlog import Event
from bot.store.audit import GENESIS, event_hash
from kit.canonical import canonical


def chain(count: int, start: int = 1, data: dict[str, object] | None = None) -> list[Event]:
    """``count`` events from position ``start``, each chained to the one before."""
    events, prev = [], GENESIS
    for seq in range(start, start + count):
        ts = f"2026-03-04T05:06:{seq % 60:02d}.{seq:06d}Z"
        body = canonical(data if data is not None else {"n": seq, "text": 'ünï "quoted"]'})
        execution_id = None if seq % 5 == 0 else 7
        digest = event_hash(ts, execution_id, "step_finished", "alice", body, prev)
        events.append(Event(seq, ts, execution_id, "step_finished", "alice", body, prev, digest))
        prev = digest
    return events

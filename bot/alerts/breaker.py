"""The breaker on automation: alert proposals and ``auto_run`` stop when the bot holds more than
``remediation.breaker.max_pool_share`` of a pool out of service, or took out more than
``max_nodes_per_hour`` nodes in the last hour, until a person resets it. Requests by people
still work. Its state is the audit log's: the newest ``breaker_tripped`` or ``breaker_reset``
event. What the bot holds out is what the systems show (drains with its mark, cordons with
its annotation), the execution history only when no system is listed."""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, func, select, text

from bot.execution import remediations
from bot.runbooks.inventory import PoolInventory
from bot.service import Service
from bot.store import audit
from bot.store.schema import audit_events
from bot.store.schema import executions as executions_table
from bot.store.words import Kind
from kit.errors import Refused

BREAKER_USER = "breaker"  # who trips it
_BREAKER_LOCK = zlib.crc32(b"gpu-runbook-bot breaker") & 0x7FFF_FFFF
HOUR = 3600.0


@dataclass(frozen=True)
class Status:
    """The breaker now: tripped or not, and the counts it decides on."""

    tripped: bool
    event_seq: int | None = None  # the newest breaker event
    event_ts: str | None = None
    event_actor: str | None = None
    reason: str | None = None  # why it tripped, or the reset's reason
    held_out: dict[str, list[str]] = field(default_factory=dict)  # pool -> nodes out now
    pool_sizes: dict[str, int] = field(default_factory=dict)
    last_hour: list[str] = field(default_factory=list)  # nodes taken out in the last hour


def _latest(conn: Connection, kinds: tuple[Kind, ...] = (Kind.BREAKER_TRIPPED,
                                                        Kind.BREAKER_RESET)) -> Any:
    return conn.execute(
        select(audit_events.c.seq, audit_events.c.ts, audit_events.c.kind,
               audit_events.c.actor, audit_events.c.data)
        .where(audit_events.c.kind.in_(kinds))
        .order_by(audit_events.c.seq.desc()).limit(1)).first()


@dataclass(frozen=True)
class _Facts:
    """Read before the breaker's transaction (loading runbooks writes to the database)."""

    kinds: dict[str, str]  # runbook -> drain, repair or resume
    pools: dict[str, frozenset[str]]
    # the nodes the systems show the bot holds out (its drain marks, its cordons), with the
    # executions that hold each; None when the bot lists no system, or one did not answer:
    # then the execution history decides
    held: Mapping[str, frozenset[int]] | None = None

    @classmethod
    def of(cls, service: Service) -> _Facts:
        inventory = service.refresh_inventory()
        pools = {"slurm": frozenset(inventory.slurm),
                 "kubernetes": frozenset(inventory.kubernetes)}
        listed = isinstance(inventory, PoolInventory) and inventory.listed
        return cls(service.remediation_kinds(), {k: v for k, v in pools.items() if v},
                   inventory.held_by_bot if isinstance(inventory, PoolInventory) and listed
                   else None)


def _counts(facts: _Facts, conn: Connection, since: str) -> tuple[
        dict[str, list[str]], dict[str, int], list[str]]:
    out = (_held_since(facts.held, conn, since) if facts.held is not None
           else remediations.held_out(conn, facts.kinds, since))
    hour = max(since, remediations.iso_ago(HOUR))
    taking = [name for name, kind in facts.kinds.items() if kind != "resume"]
    recent = remediations.taken_out(conn, taking, hour)
    held = {pool: sorted(out & nodes) for pool, nodes in facts.pools.items()}
    return held, {pool: len(nodes) for pool, nodes in facts.pools.items()}, sorted(recent)


def _held_since(held: Mapping[str, frozenset[int]], conn: Connection, since: str) -> set[str]:
    """The nodes held out by executions requested since the last reset (a reset forgives
    what was out before it, as it does with the history)."""
    if not since:
        return set(held)
    first = conn.execute(select(func.min(executions_table.c.id))
                         .where(executions_table.c.requested_at >= since)).scalar()
    if first is None:
        return set()
    return {node for node, holders in held.items() if max(holders) >= first}


def _status(facts: _Facts, conn: Connection) -> Status:
    row = _latest(conn)
    data = json.loads(row.data) if row is not None else {}
    last_reset = row if row is None or row.kind == Kind.BREAKER_RESET else _latest(
        conn, (Kind.BREAKER_RESET,))
    since = last_reset.ts if last_reset is not None else ""  # counting starts at a reset
    held, sizes, recent = _counts(facts, conn, since)
    return Status(tripped=row is not None and row.kind == Kind.BREAKER_TRIPPED,
                  event_seq=row.seq if row else None, event_ts=row.ts if row else None,
                  event_actor=row.actor if row else None, reason=data.get("reason"),
                  held_out=held, pool_sizes=sizes, last_hour=recent)


def tripped(service: Service) -> tuple[int, str] | None:
    """(its event's position, why) while the breaker is tripped; else None. One indexed
    read: cheap enough for every tick of the chat poster."""
    with service.db.connect() as conn:
        row = _latest(conn)
    if row is None or row.kind != Kind.BREAKER_TRIPPED:
        return None
    return int(row.seq), str(json.loads(row.data).get("reason"))


def status(service: Service) -> Status:
    facts = _Facts.of(service)
    with service.db.connect() as conn:
        return _status(facts, conn)


def over_limits(service: Service, now: Status) -> str | None:
    """Why automation must stop, by the counts in ``now``; None while within the limits."""
    limits = service.config.remediation.breaker
    for pool, nodes in sorted(now.held_out.items()):
        size = now.pool_sizes.get(pool, 0)
        if size and len(nodes) / size > limits.max_pool_share:
            return (f"the bot holds {len(nodes)} of the {size} nodes of the {pool} pool out of "
                    f"service ({', '.join(nodes)}): more than "
                    f"{limits.max_pool_share:.0%} (remediation.breaker.max_pool_share)")
    if len(now.last_hour) > limits.max_nodes_per_hour:
        return (f"{len(now.last_hour)} nodes taken out in the last hour "
                f"({', '.join(now.last_hour)}): more than {limits.max_nodes_per_hour} "
                "(remediation.breaker.max_nodes_per_hour)")
    return None


def stopped(service: Service) -> str | None:
    """Why automation may not act now (the breaker is tripped, or trips now: recorded once,
    whichever replica gets there first); None when it may."""
    facts = _Facts.of(service)
    with service.db.begin() as conn:
        _one_at_a_time(conn)
        now = _status(facts, conn)
        if now.tripped:
            return _tripped_text(now)
        reason = over_limits(service, now)
        if reason is None:
            return None
        audit.append(conn, Kind.BREAKER_TRIPPED, BREAKER_USER, {
            "reason": reason, "held_out": now.held_out, "pool_sizes": now.pool_sizes,
            "last_hour": now.last_hour})
    return f"the breaker on automation tripped: {reason}. {RESET_HINT}"


RESET_HINT = ("Alerts propose nothing and auto_run stops until a person resets it "
              "(`runbook breaker reset --reason ...`, or `breaker reset` in the chat)")


def _tripped_text(now: Status) -> str:
    return (f"the breaker on automation is tripped (since {now.event_ts}): {now.reason}. "
            f"{RESET_HINT}")


def reset(service: Service, user: str, reason: str) -> Status:
    """A person closes the breaker again; only an approver may. Counting starts anew."""
    if not service.config.matches(user, service.config.approvers):
        raise Refused(f"{user} may not reset the breaker: only approvers may (approvers: "
                      f"{', '.join(service.config.approvers) or 'nobody configured'})")
    if not reason.strip():
        raise Refused("say why the breaker may close again: --reason TEXT")
    facts = _Facts.of(service)
    with service.db.begin() as conn:
        _one_at_a_time(conn)
        now = _status(facts, conn)
        if not now.tripped:
            raise Refused("the breaker is not tripped: nothing to reset")
        audit.append(conn, Kind.BREAKER_RESET, user, {
            "reason": reason[:500], "tripped_seq": now.event_seq,
            "held_out": now.held_out, "last_hour": now.last_hour})
    return status(service)


def _one_at_a_time(conn: Connection) -> None:
    """Two replicas deciding at once record one trip (SQLite's BEGIN IMMEDIATE serialises
    already)."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _BREAKER_LOCK})


def status_text(now: Status) -> str:
    """The breaker for people (CLI and chat)."""
    head = (f"breaker: TRIPPED since {now.event_ts}: {now.reason}" if now.tripped else
            "breaker: closed (automation runs)"
            + (f"; last reset {now.event_ts} by {now.event_actor}: {now.reason}"
               if now.event_seq is not None else ""))
    lines = [head]
    for pool, size in sorted(now.pool_sizes.items()):
        nodes = now.held_out.get(pool, [])
        lines.append(f"  {pool}: {len(nodes)} of {size} nodes held out by the bot"
                     + (f" ({', '.join(nodes)})" if nodes else ""))
    lines.append(f"  taken out in the last hour: {len(now.last_hour)}"
                 + (f" ({', '.join(now.last_hour)})" if now.last_hour else ""))
    return "\n".join(lines)

"""Reads the surfaces make (the console's pages, the Slack poster) that no other module of the
store or the execution layer answers: each a function of a connection, so that a page reads
what it shows in one transaction, and the surfaces never name a table or build a statement.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, RowMapping, func, select

from bot.store.schema import (
    approvals,
    audit_archives,
    audit_events,
    confirmations,
    execution_nodes,
    executions,
    proposals,
    runbook_versions,
)
from bot.store.words import NOT_ENDED, Kind

CHUNK = 500  # bound parameters per statement


# --- executions ------------------------------------------------------------------------------


def execution_ids_since(conn: Connection, since: str) -> list[int]:
    """Executions not ended, and those requested at or after ``since``, in ID order."""
    return list(conn.execute(select(executions.c.id).where(
        executions.c.state.in_(sorted(NOT_ENDED)) | (executions.c.requested_at >= since))
        .order_by(executions.c.id)).scalars())


def touching(conn: Connection, node: str, limit: int,
             before: int | None = None) -> list[dict[str, Any]]:
    """The executions that locked ``node``, newest first, IDs under ``before``; at most
    ``limit`` (id, runbook, version, state, requested_by, requested_at, finished_at, params)."""
    c = executions.c
    query = (select(c.id, c.runbook, c.version, c.state, c.requested_by, c.requested_at,
                    c.finished_at, c.params)
             .join(execution_nodes, execution_nodes.c.execution_id == c.id)
             .where(execution_nodes.c.node == node)
             .order_by(c.id.desc()).limit(limit))
    if before is not None:
        query = query.where(c.id < before)
    return [dict(row) for row in conn.execute(query).mappings()]


def decisions(conn: Connection, execution_id: int) -> list[RowMapping]:
    """Every approval and denial of the execution, in the order given."""
    return list(conn.execute(select(approvals).where(approvals.c.execution_id == execution_id)
                             .order_by(approvals.c.id)).mappings())


def questions(conn: Connection, execution_id: int) -> list[RowMapping]:
    """The questions its steps asked (chat.confirm), in the order asked, with their answers."""
    return list(conn.execute(select(confirmations).where(
        confirmations.c.execution_id == execution_id)
        .order_by(confirmations.c.asked_at)).mappings())


def question(conn: Connection, execution_id: int, step_id: str) -> RowMapping | None:
    """The question one step asked, with its answer when given; None when it asked none."""
    return conn.execute(select(confirmations).where(
        confirmations.c.execution_id == execution_id,
        confirmations.c.step_id == step_id)).mappings().first()


# --- proposals ---------------------------------------------------------------------------


def open_proposal_ids(conn: Connection) -> list[int]:
    return list(conn.execute(select(proposals.c.id).where(
        proposals.c.state == "open")).scalars())


# --- runbook versions ---------------------------------------------------------------------


def version_counts(conn: Connection) -> dict[str, int]:
    """Runbook name -> how many versions of it the bot has recorded."""
    return {str(name): int(count) for name, count in conn.execute(
        select(runbook_versions.c.name, func.count()).group_by(runbook_versions.c.name))}


# --- the audit log as stored (the console checks each event's place in the chain) --------


def stored_events(conn: Connection, execution_id: int) -> list[RowMapping]:
    """The execution's audit events as stored (``data`` the JSON text the hash covers), in
    chain order."""
    return list(conn.execute(select(audit_events).where(
        audit_events.c.execution_id == execution_id)
        .order_by(audit_events.c.seq)).mappings())


def hashes(conn: Connection, seqs: Iterable[int]) -> dict[int, str]:
    """seq -> stored hash of the events asked for that exist."""
    wanted = sorted(set(seqs))
    found: dict[int, str] = {}
    for start in range(0, len(wanted), CHUNK):
        found.update((int(seq), str(digest)) for seq, digest in conn.execute(
            select(audit_events.c.seq, audit_events.c.hash)
            .where(audit_events.c.seq.in_(wanted[start:start + CHUNK]))))
    return found


def verifications(conn: Connection, limit: int) -> list[dict[str, Any]]:
    """The latest ``chain_verified`` events, newest first: their data (an edited one's stored
    text that is not an object reads as {}) with seq, ts and actor."""
    found = []
    for row in conn.execute(select(audit_events.c.seq, audit_events.c.ts, audit_events.c.actor,
                                   audit_events.c.data)
                            .where(audit_events.c.kind == Kind.CHAIN_VERIFIED)
                            .order_by(audit_events.c.seq.desc()).limit(limit)).mappings():
        try:
            data = json.loads(row["data"])
        except ValueError:
            data = {}
        if not isinstance(data, dict):
            data = {}
        found.append({**data, "seq": row["seq"], "ts": row["ts"], "actor": row["actor"]})
    return found


def archives(conn: Connection) -> list[RowMapping]:
    """The rows of the audit log's archives, newest first."""
    return list(conn.execute(select(audit_archives)
                             .order_by(audit_archives.c.up_to_seq.desc())).mappings())

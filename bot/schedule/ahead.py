"""Approvals collected ahead of a run, on a schedule or a maintenance window.

An approval ahead binds to a plan hash (a schedule's plan; a window's digest of all its
plans), like an approval of a request. When the run is requested, ``Service.request`` counts
them only if planning then gives the same hash, and only for approvers the runbook's
policy accepts; otherwise the run waits for approval like any request.
"""

from __future__ import annotations

from sqlalchemy import Connection, select

from bot.store.db import now_iso
from bot.store.schema import approvals_ahead


def record(conn: Connection, subject: str, user: str, plan_hash: str) -> bool:
    """Record ``user``'s approval of ``plan_hash`` on ``subject``; False if already there."""
    exists = conn.execute(select(approvals_ahead.c.user).where(
        approvals_ahead.c.subject == subject, approvals_ahead.c.user == user,
        approvals_ahead.c.plan_hash == plan_hash)).first()
    if exists is not None:
        return False
    conn.execute(approvals_ahead.insert().values(subject=subject, user=user,
                                                 plan_hash=plan_hash, at=now_iso()))
    return True


def approvers(conn: Connection, subject: str, plan_hash: str) -> list[str]:
    """Who approved ``plan_hash`` on ``subject``, first first."""
    rows = conn.execute(select(approvals_ahead.c.user).where(
        approvals_ahead.c.subject == subject, approvals_ahead.c.plan_hash == plan_hash,
    ).order_by(approvals_ahead.c.at, approvals_ahead.c.user))
    return list(rows.scalars())

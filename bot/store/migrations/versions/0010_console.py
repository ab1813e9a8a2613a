"""The console's filters: each execution's source, break-glass and failed checks as columns,
the nodes its plan locks (execution_nodes), and indexes for keyset paging and the approver
filter. Existing rows are filled from their plan and their audit events.

Revision ID: 0010
Revises: 0009
"""

import json
from collections import Counter
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

BATCH = 2000
UNFINISHED = "9999-12-31T23:59:59.999999Z"  # as bot.store.schema: sorts after every time


def upgrade() -> None:
    with op.batch_alter_table("executions") as batch:
        batch.add_column(sa.Column("source", sa.String(16), nullable=True))
        batch.add_column(sa.Column("break_glass", sa.Boolean, nullable=False,
                                   server_default=sa.false()))
        batch.add_column(sa.Column("checks_failed", sa.Integer, nullable=False,
                                   server_default="0"))
    op.create_table(
        "execution_nodes",
        sa.Column("node", sa.String(200), primary_key=True),
        sa.Column("execution_id", sa.Integer, sa.ForeignKey("executions.id"),
                  primary_key=True),
    )
    _backfill(op.get_bind())
    # indexes after the backfill: built once, not row by row
    op.create_index("ix_execution_nodes_execution", "execution_nodes", ["execution_id"])
    # keyset paging: (sort value, id) for every sort of the console's table
    op.drop_index("ix_executions_state", "executions")
    op.create_index("ix_executions_state", "executions", ["state", "id"])
    op.create_index("ix_executions_requested", "executions", ["requested_at", "id"])
    op.create_index("ix_executions_finished", "executions",
                    [sa.text(f"coalesce(finished_at, '{UNFINISHED}')"), "id"])
    op.create_index("ix_executions_runbook", "executions", ["runbook", "id"])
    op.create_index("ix_executions_requested_by", "executions", ["requested_by", "id"])
    op.create_index("ix_approvals_user", "approvals", ["user", "execution_id"])
    # the chain page's last verification: the newest event of one kind, without a scan
    op.create_index("ix_audit_kind_seq", "audit_events", ["kind", "seq"])


def downgrade() -> None:
    op.drop_index("ix_audit_kind_seq", "audit_events")
    op.drop_index("ix_approvals_user", "approvals")
    for name in ("ix_executions_requested_by", "ix_executions_runbook",
                 "ix_executions_finished", "ix_executions_requested", "ix_executions_state"):
        op.drop_index(name, "executions")
    op.create_index("ix_executions_state", "executions", ["state"])
    op.drop_table("execution_nodes")
    with op.batch_alter_table("executions") as batch:
        batch.drop_column("checks_failed")
        batch.drop_column("break_glass")
        batch.drop_column("source")


def _backfill(conn: sa.Connection) -> None:
    """Source from each execution's "requested" event, failed checks from its
    "check_evaluated" events (events already archived are not seen: those stay unknown and
    0), break-glass and nodes from its stored plan (its node:NAME locks)."""
    sources, failed = _from_events(conn)
    updates: list[dict[str, Any]] = []
    nodes: list[dict[str, Any]] = []
    plans = conn.execute(sa.text("SELECT id, plan FROM executions ORDER BY id")
                         .execution_options(stream_results=True, yield_per=BATCH))
    for execution_id, plan_json in plans:
        plan = json.loads(plan_json)
        updates.append({"id": execution_id, "source": sources.get(execution_id),
                        "break_glass": bool(plan.get("break_glass", False)),
                        "checks_failed": failed.get(execution_id, 0)})
        nodes += [{"node": lock[5:], "execution_id": execution_id}
                  for lock in sorted(set(plan.get("locks") or [])) if lock.startswith("node:")]
    update = sa.text("UPDATE executions SET source = :source, break_glass = :break_glass, "
                     "checks_failed = :checks_failed WHERE id = :id")
    insert = sa.text("INSERT INTO execution_nodes (node, execution_id) "
                     "VALUES (:node, :execution_id)")
    for rows, statement in ((updates, update), (nodes, insert)):
        for start in range(0, len(rows), BATCH):
            conn.execute(statement, rows[start:start + BATCH])


def _from_events(conn: sa.Connection) -> tuple[dict[int, str], Counter[int]]:
    sources: dict[int, str] = {}
    failed: Counter[int] = Counter()
    events = conn.execute(
        sa.text("SELECT execution_id, kind, data FROM audit_events WHERE execution_id IS NOT "
                "NULL AND kind IN ('requested', 'check_evaluated') ORDER BY seq")
        .execution_options(stream_results=True, yield_per=BATCH))
    for execution_id, kind, data in events:
        try:
            found = json.loads(data)
        except ValueError:  # an edited event: verify names it; the backfill skips it
            continue
        if not isinstance(found, dict):
            continue
        if kind == "requested" and isinstance(found.get("source"), str):
            sources.setdefault(execution_id, found["source"][:16])
        elif kind == "check_evaluated" and found.get("passed") is False:
            failed[execution_id] += 1
    return sources, failed

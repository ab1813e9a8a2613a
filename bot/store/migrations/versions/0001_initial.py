"""Initial schema: runbook versions, executions, step states, approvals, locks, audit log.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runbook_versions",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("version", sa.String(64), primary_key=True),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("first_seen", sa.String(32), nullable=False),
    )
    op.create_table(
        "executions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("runbook", sa.String(64), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("params", sa.Text, nullable=False),
        sa.Column("requested_by", sa.String(128), nullable=False),
        sa.Column("requested_at", sa.String(32), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("stage", sa.String(32), nullable=False),
        sa.Column("plan", sa.Text, nullable=False),
        sa.Column("plan_hash", sa.String(64), nullable=False),
        sa.Column("approvals_required", sa.Integer, nullable=False),
        sa.Column("approval_deadline", sa.Float, nullable=True),
        sa.Column("resume", sa.String(16), nullable=False),
        sa.Column("owner", sa.String(128), nullable=True),
        sa.Column("lease_until", sa.Float, nullable=True),
        sa.Column("cancel_requested", sa.Boolean, nullable=False),
        sa.Column("resume_requested", sa.Boolean, nullable=False),
        sa.Column("fencing_token", sa.Integer, nullable=False),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("finished_at", sa.String(32), nullable=True),
    )
    op.create_index("ix_executions_state", "executions", ["state"])
    op.create_table(
        "step_states",
        sa.Column("execution_id", sa.Integer, sa.ForeignKey("executions.id"), primary_key=True),
        sa.Column("phase", sa.String(8), primary_key=True),
        sa.Column("step_id", sa.String(64), primary_key=True),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("started_at", sa.String(32), nullable=True),
        sa.Column("finished_at", sa.String(32), nullable=True),
        sa.Column("result", sa.Text, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
    )
    op.create_table(
        "approvals",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("execution_id", sa.Integer, sa.ForeignKey("executions.id"), nullable=False),
        sa.Column("user", sa.String(128), nullable=False),
        sa.Column("decision", sa.String(8), nullable=False),
        sa.Column("plan_hash", sa.String(64), nullable=False),
        sa.Column("at", sa.String(32), nullable=False),
        sa.Column("reason", sa.Text, nullable=True),
    )
    op.create_index("ix_approvals_execution", "approvals", ["execution_id"])
    op.create_table(
        "locks",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("execution_id", sa.Integer, nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("acquired_at", sa.String(32), nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("token", sa.Integer, nullable=False),
    )
    op.create_table(
        "counters",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.Integer, nullable=False),
    )
    op.create_table(
        "audit_events",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("ts", sa.String(32), nullable=False),
        sa.Column("execution_id", sa.Integer, nullable=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("data", sa.Text, nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
    )
    op.create_index("ix_audit_execution", "audit_events", ["execution_id"])
    op.create_index("ix_audit_ts", "audit_events", ["ts"])


def downgrade() -> None:
    for table in ("audit_events", "counters", "locks", "approvals", "step_states", "executions",
                  "runbook_versions"):
        op.drop_table(table)

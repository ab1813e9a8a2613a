"""Schedules, approvals collected ahead, scheduled runs, maintenance windows and
APScheduler's job store table.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("runbook", sa.String(64), nullable=False),
        sa.Column("params", sa.Text, nullable=False),
        sa.Column("cron", sa.String(200), nullable=True),
        sa.Column("at", sa.String(32), nullable=True),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("approve", sa.String(16), nullable=False),
        sa.Column("plan_hash", sa.String(64), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("config_name", sa.String(64), nullable=True, unique=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("revision", sa.Integer, nullable=False, server_default="1"),
        sa.Column("last_handled", sa.String(32), nullable=True),
        sa.Column("last_outcome", sa.Text, nullable=True),
        sa.Column("last_execution_id", sa.Integer, nullable=True),
        sa.Column("missed", sa.Integer, nullable=False, server_default="0"),
        sa.Column("updated_at", sa.String(32), nullable=False),
    )
    op.create_table(
        "approvals_ahead",
        sa.Column("subject", sa.String(64), primary_key=True),
        sa.Column("user", sa.String(128), primary_key=True),
        sa.Column("plan_hash", sa.String(64), primary_key=True),
        sa.Column("at", sa.String(32), nullable=False),
    )
    op.create_table(
        "scheduled_runs",
        sa.Column("subject", sa.String(64), primary_key=True),
        sa.Column("scheduled_for", sa.String(32), primary_key=True),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("execution_id", sa.Integer, nullable=True),
        sa.Column("detail", sa.Text, nullable=True),
        sa.Column("at", sa.String(32), nullable=False),
    )
    op.create_table(
        "maintenance_windows",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("nodes", sa.Text, nullable=False),
        sa.Column("starts_at", sa.String(32), nullable=False),
        sa.Column("duration_seconds", sa.Float, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("runbooks", sa.Text, nullable=False),
        sa.Column("plans", sa.Text, nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("open_execution_id", sa.Integer, nullable=True),
        sa.Column("close_execution_id", sa.Integer, nullable=True),
        sa.Column("runs", sa.Text, nullable=False),
        sa.Column("report", sa.Text, nullable=True),
        sa.Column("updated_at", sa.String(32), nullable=False),
    )
    op.create_index("ix_maintenance_windows_state", "maintenance_windows", ["state"])
    # The table APScheduler's SQLAlchemyJobStore declares (it would create it on start).
    op.create_table(
        "apscheduler_jobs",
        sa.Column("id", sa.Unicode(191), primary_key=True),
        sa.Column("next_run_time", sa.Float(25), nullable=True),
        sa.Column("job_state", sa.LargeBinary, nullable=False),
    )
    op.create_index("ix_apscheduler_jobs_next_run_time", "apscheduler_jobs", ["next_run_time"])


def downgrade() -> None:
    op.drop_table("apscheduler_jobs")
    op.drop_table("maintenance_windows")
    op.drop_table("scheduled_runs")
    op.drop_table("approvals_ahead")
    op.drop_table("schedules")

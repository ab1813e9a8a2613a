"""Proposals: runbooks proposed by alerts (Alertmanager webhook).

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "proposals",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("alertname", sa.String(200), nullable=False),
        sa.Column("labels", sa.Text, nullable=False),
        sa.Column("runbook", sa.String(64), nullable=False),
        sa.Column("params", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("alert_status", sa.String(16), nullable=False),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("updated_at", sa.String(32), nullable=False),
        sa.Column("execution_id", sa.Integer, nullable=True),
        sa.Column("note", sa.Text, nullable=True),
    )
    op.create_index("ix_proposals_fingerprint", "proposals", ["fingerprint"])


def downgrade() -> None:
    op.drop_table("proposals")

"""Audit shipping: one cursor per destination of the audit log (syslog, OTLP): how far
that receiver has accepted it (bot.store.shipping).

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_cursors",
        sa.Column("destination", sa.String(255), primary_key=True),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("updated_at", sa.String(32), nullable=False),
        sa.Column("skipped", sa.Integer, nullable=False),
        sa.Column("rejected", sa.Integer, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("audit_cursors")

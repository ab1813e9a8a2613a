"""Audit archives: the events moved out of the log into a verified file (runbook audit
archive), so that verify starts after them from the archive's head hash.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_archives",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("from_seq", sa.Integer, nullable=False),
        sa.Column("up_to_seq", sa.Integer, nullable=False),
        sa.Column("head_hash", sa.String(64), nullable=False),
        sa.Column("file", sa.Text, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("audit_archives")

"""Confirmations: a person confirms a physical step (chat.confirm).

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "confirmations",
        sa.Column("execution_id", sa.Integer, sa.ForeignKey("executions.id"), primary_key=True),
        sa.Column("step_id", sa.String(64), primary_key=True),
        sa.Column("question", sa.Text, nullable=False),
        sa.Column("asked_at", sa.String(32), nullable=False),
        sa.Column("answer", sa.String(8), nullable=True),
        sa.Column("answered_by", sa.String(128), nullable=True),
        sa.Column("answered_at", sa.String(32), nullable=True),
        sa.Column("note", sa.Text, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("confirmations")

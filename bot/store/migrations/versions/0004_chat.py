"""Chat surfaces: messages the bot keeps up to date, and deliveries already acted on.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "chat_messages",
        sa.Column("subject", sa.String(128), primary_key=True),
        sa.Column("channel", sa.String(64), nullable=False),
        sa.Column("ts", sa.String(32), nullable=True),
        sa.Column("rendered", sa.String(64), nullable=True),
        sa.Column("final", sa.Integer, nullable=False, server_default="0"),
        sa.Column("updated_at", sa.String(32), nullable=False),
    )
    op.create_table(
        "chat_deliveries",
        sa.Column("key", sa.String(200), primary_key=True),
        sa.Column("received_at", sa.String(32), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("chat_deliveries")
    op.drop_table("chat_messages")

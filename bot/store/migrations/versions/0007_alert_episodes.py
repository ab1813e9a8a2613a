"""Alert episodes on proposals: when the firing a proposal is about started (Alertmanager's
startsAt) and when the bot last heard its alert resolve, so that a re-sent or flapping alert
updates its proposal instead of making new ones.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("proposals") as batch:
        batch.add_column(sa.Column("alert_started_at", sa.String(40), nullable=True))
        batch.add_column(sa.Column("resolved_at", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("proposals") as batch:
        batch.drop_column("resolved_at")
        batch.drop_column("alert_started_at")

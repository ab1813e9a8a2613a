"""Change references: each execution's change or incident reference (change=REF on the
request, policy.require_change) as a column, for the console's filter and `runbook audit
export --change`. Older executions have none.

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

UNFINISHED = "9999-12-31T23:59:59.999999Z"  # as bot.store.schema: sorts after every time


def upgrade() -> None:
    with op.batch_alter_table("executions") as batch:
        batch.add_column(sa.Column("change", sa.String(64), nullable=True))
    op.create_index("ix_executions_change", "executions", ["change", "id"])


def downgrade() -> None:
    op.drop_index("ix_executions_change", "executions")
    # SQLite's batch copy cannot reflect an expression index: drop it, then build it again
    op.drop_index("ix_executions_finished", "executions")
    with op.batch_alter_table("executions") as batch:
        batch.drop_column("change")
    op.create_index("ix_executions_finished", "executions",
                    [sa.text(f"coalesce(finished_at, '{UNFINISHED}')"), "id"])

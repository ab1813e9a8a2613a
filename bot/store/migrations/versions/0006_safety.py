"""Safety: a row version for compare-and-set transitions, a claim epoch for fencing
engines, and one decision per approver and plan.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("executions") as batch:
        batch.add_column(sa.Column("row_version", sa.Integer, nullable=False,
                                   server_default="0"))
        batch.add_column(sa.Column("epoch", sa.Integer, nullable=False, server_default="0"))
    # A decision recorded twice by a race before this revision: keep the first.
    op.execute(
        "DELETE FROM approvals WHERE id NOT IN (SELECT MIN(id) FROM approvals "
        "GROUP BY execution_id, \"user\", plan_hash)"
    )
    op.create_index("ux_approvals_decision", "approvals", ["execution_id", "user", "plan_hash"],
                    unique=True)

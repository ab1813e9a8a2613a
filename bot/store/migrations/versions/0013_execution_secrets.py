"""Secret parameters: each unfinished execution's secret values, encrypted with the site key
(secrets.key_file or RUNBOOK_SECRET_KEY), deleted when it ends. The plan holds only a
placeholder with a keyed fingerprint.

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "execution_secrets",
        sa.Column("execution_id", sa.Integer, sa.ForeignKey("executions.id"), primary_key=True),
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("sealed", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("execution_secrets")

"""NCCL baselines: the bus bandwidth each shape of node set reached in nccl-test
(slurm.nccl_test), which later runs are judged against.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "nccl_baselines",
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("busbw", sa.Float, nullable=False),
        sa.Column("avg_busbw", sa.Float, nullable=False),
        sa.Column("nodes", sa.Text, nullable=False),
        sa.Column("execution_id", sa.Integer, nullable=False),
        sa.Column("recorded_at", sa.String(32), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("nccl_baselines")

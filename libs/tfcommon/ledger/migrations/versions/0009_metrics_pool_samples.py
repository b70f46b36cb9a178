"""The dashboard's pool history: `metrics_pool_sample`, one row per pool per sample.

Revision ID: 0009_metrics_pool_samples
Revises: 0008_allocation_hold
Create Date: 2026-12-03

Every `TF_HISTORY_INTERVAL_S` the metrics service writes each pool's allocation, stranded capacity and
FGD fragmentation rate as computed for its Prometheus series, and deletes the rows older than 24 hours,
so a restarted service still draws the last day. Written only by the metrics service. Frozen snapshot.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0009_metrics_pool_samples"
down_revision: str | None = "0008_allocation_hold"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "metrics_pool_sample",
        sa.Column("pool_name", sa.Text(), nullable=False),
        sa.Column("sampled_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("whole_idle_gpus", sa.Integer(), nullable=False),
        sa.Column("capacity_tflops_milli", sa.BigInteger(), nullable=False),
        sa.Column("allocated_tflops_milli", sa.BigInteger(), nullable=False),
        sa.Column("capacity_vram_bytes", sa.BigInteger(), nullable=False),
        sa.Column("allocated_vram_bytes", sa.BigInteger(), nullable=False),
        sa.Column("stranded_tflops_milli", sa.BigInteger(), nullable=False),
        sa.Column("stranded_vram_bytes", sa.BigInteger(), nullable=False),
        sa.Column("fragmentation_rate", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("pool_name", "sampled_at", name=op.f("pk_metrics_pool_sample")),
    )
    op.create_index("ix_metrics_pool_sample_sampled_at", "metrics_pool_sample", ["sampled_at"])


def downgrade() -> None:
    op.drop_index("ix_metrics_pool_sample_sampled_at", table_name="metrics_pool_sample")
    op.drop_table("metrics_pool_sample")

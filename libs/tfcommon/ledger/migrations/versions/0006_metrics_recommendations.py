"""Autoscaling recommendations per workload, and each allocation's eviction-protection duration.

Revision ID: 0006_metrics_recommendations
Revises: 0005_pod_index_sequence
Create Date: 2026-12-02

`workload_recommendation`: one row per workload (`namespace/workload`), its latest recommended per-GPU
request and limit beside the values it had, when, why and on how many samples; written only by the
metrics service. `allocation.eviction_protection_s`: the pod's `tensor-fusion.ai/eviction-protection`
in seconds (NULL: none), set when the scheduler reserves, so bills from the ledger carry the surcharge.
Frozen snapshot.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006_metrics_recommendations"
down_revision: str | None = "0005_pod_index_sequence"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "workload_recommendation",
        sa.Column("workload_key", sa.Text(), nullable=False),
        sa.Column("pool", sa.Text(), nullable=False),
        sa.Column("qos", sa.Text(), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("request_tflops_milli", sa.BigInteger(), nullable=False),
        sa.Column("limit_tflops_milli", sa.BigInteger(), nullable=False),
        sa.Column("request_vram_bytes", sa.BigInteger(), nullable=False),
        sa.Column("limit_vram_bytes", sa.BigInteger(), nullable=False),
        sa.Column("current_request_tflops_milli", sa.BigInteger(), nullable=False),
        sa.Column("current_limit_tflops_milli", sa.BigInteger(), nullable=False),
        sa.Column("current_request_vram_bytes", sa.BigInteger(), nullable=False),
        sa.Column("current_limit_vram_bytes", sa.BigInteger(), nullable=False),
        sa.Column("sample_count", sa.Integer(), nullable=False),
        sa.Column("sufficient", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("computed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("workload_key", name=op.f("pk_workload_recommendation")),
    )
    op.add_column("allocation", sa.Column("eviction_protection_s", sa.BigInteger(), nullable=True))
    op.create_check_constraint(
        op.f("ck_allocation_eviction_protection_not_negative"),
        "allocation",
        "eviction_protection_s >= 0",
    )


def downgrade() -> None:
    op.drop_constraint(op.f("ck_allocation_eviction_protection_not_negative"), "allocation", type_="check")
    op.drop_column("allocation", "eviction_protection_s")
    op.drop_table("workload_recommendation")

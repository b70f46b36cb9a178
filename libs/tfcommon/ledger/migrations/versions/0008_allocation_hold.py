"""Whom a defrag capacity hold is for: `allocation_hold`, so the replacement can claim the hold.

Revision ID: 0008_allocation_hold
Revises: 0007_allocation_share_index
Create Date: 2026-12-02

One row per hold allocation (the defrag planner's reservation of a move's target capacity): the
evicted pod's namespace, name and controller owner uid, the pool and the expiry. The scheduler claims
the hold for the replacement (`claimed_by`, `claimed_at`) in the transaction that swaps the hold for
the replacement's allocation. A partial index finds the unclaimed holds. Frozen snapshot.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008_allocation_hold"
down_revision: str | None = "0007_allocation_share_index"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "allocation_hold",
        sa.Column("allocation_id", sa.Uuid(), nullable=False),
        sa.Column("pool_name", sa.Text(), nullable=False),
        sa.Column("workload_namespace", sa.Text(), nullable=False),
        sa.Column("workload_name", sa.Text(), nullable=False),
        sa.Column("owner_uid", sa.Text(), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.Column("claimed_by", sa.Uuid(), nullable=True),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("allocation_id", name=op.f("pk_allocation_hold")),
        sa.CheckConstraint(
            "(claimed_by IS NULL) = (claimed_at IS NULL)", name=op.f("ck_allocation_hold_claimed_together")
        ),
    )
    op.create_index(
        "ix_allocation_hold_unclaimed_expires_at",
        "allocation_hold",
        ["expires_at"],
        postgresql_where=sa.text("claimed_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_allocation_hold_unclaimed_expires_at", table_name="allocation_hold")
    op.drop_table("allocation_hold")

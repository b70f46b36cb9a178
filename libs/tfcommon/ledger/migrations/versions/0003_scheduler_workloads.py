"""`scheduler_workload`: every workload submitted to the scheduler, and where it is in its life.

Revision ID: 0003_scheduler_workloads
Revises: 0002_takeover_slots
Create Date: 2026-12-02

One row per workload, keyed by the allocation id the workload can ever hold. Pending workloads wait
here (with their reason) until capacity or quota frees, so nothing needed to place them lives only in
memory. Written only by the scheduler. Frozen snapshot.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003_scheduler_workloads"
down_revision: str | None = "0002_takeover_slots"
branch_labels: str | None = None
depends_on: str | None = None

STATES = ("pending", "placed", "refused", "ended", "evicted")


def upgrade() -> None:
    op.create_table(
        "scheduler_workload",
        sa.Column("allocation_id", sa.Uuid(), nullable=False),
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("uid", sa.Text(), nullable=True),
        sa.Column("submission", postgresql.JSONB(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("qos_rank", sa.Integer(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("allocation_id", name=op.f("pk_scheduler_workload")),
        sa.CheckConstraint(
            "state IN ({})".format(", ".join(f"'{state}'" for state in STATES)),
            name=op.f("ck_scheduler_workload_state_known"),
        ),
    )
    op.create_index(
        "ix_scheduler_workload_pending",
        "scheduler_workload",
        ["priority", "qos_rank", "submitted_at"],
        postgresql_where=sa.text("state = 'pending'"),
    )


def downgrade() -> None:
    op.drop_index("ix_scheduler_workload_pending", table_name="scheduler_workload")
    op.drop_table("scheduler_workload")

"""`takeover_slot`: the pods of each workload taken over under `tensor-fusion.ai/enabled-replicas`.

Revision ID: 0002_takeover_slots
Revises: 0001_initial
Create Date: 2026-12-02

One row per taken-over pod, keyed by the slot id written to the pod (`tensor-fusion.ai/takeover-slot`);
the count for a workload is the number of its rows, so releasing a pod can never leave the count wrong.
Written only by the webhook (claim) and by whoever sees the pod gone (release). Frozen snapshot.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002_takeover_slots"
down_revision: str | None = "0001_initial"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "takeover_slot",
        sa.Column("slot_id", sa.Text(), nullable=False),
        sa.Column("workload_key", sa.Text(), nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("slot_id", name=op.f("pk_takeover_slot")),
    )
    op.create_index(op.f("ix_takeover_slot_workload_key"), "takeover_slot", ["workload_key"])


def downgrade() -> None:
    op.drop_index(op.f("ix_takeover_slot_workload_key"), table_name="takeover_slot")
    op.drop_table("takeover_slot")

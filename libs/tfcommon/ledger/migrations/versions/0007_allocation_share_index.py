"""One reservation per allocation id: `allocation.share_index` and a unique index on it.

Revision ID: 0007_allocation_share_index
Revises: 0006_metrics_recommendations
Create Date: 2026-12-02

Each reservation numbers its GPU shares 0..N-1 (`share_index`). The unique index on
`(allocation_id, share_index)` refuses a second reservation of the same allocation id on other GPUs
(two schedulers placing one workload at once), which `(allocation_id, gpu_uuid)` alone allowed.
Existing rows are numbered by GPU UUID. Frozen snapshot.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0007_allocation_share_index"
down_revision: str | None = "0006_metrics_recommendations"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("allocation", sa.Column("share_index", sa.Integer(), nullable=True))
    op.execute(
        """
        UPDATE allocation SET share_index = numbered.position
        FROM (
            SELECT id, row_number() OVER (PARTITION BY allocation_id ORDER BY gpu_uuid) - 1 AS position
            FROM allocation
        ) AS numbered
        WHERE allocation.id = numbered.id
        """
    )
    op.alter_column("allocation", "share_index", nullable=False)
    op.create_check_constraint(
        op.f("ck_allocation_share_index_not_negative"), "allocation", "share_index >= 0"
    )
    op.create_unique_constraint(
        op.f("uq_allocation_allocation_id_share_index"), "allocation", ["allocation_id", "share_index"]
    )


def downgrade() -> None:
    op.drop_constraint(op.f("uq_allocation_allocation_id_share_index"), "allocation", type_="unique")
    op.drop_constraint(op.f("ck_allocation_share_index_not_negative"), "allocation", type_="check")
    op.drop_column("allocation", "share_index")

"""`takeover_slot.pod_uid`: the uid of the pod that holds the slot, once the scheduler has seen it.

Revision ID: 0010_takeover_slot_pod_uid
Revises: 0009_metrics_pool_samples
Create Date: 2026-12-03

A slot is claimed at admission, before its pod exists; the scheduler writes the pod's uid when the
pod first reaches it. The webhook then tells a slot whose pod is still being created (no uid, just
claimed) from one whose pod is gone (a uid, and no such pod in the API), so a ReplicaSet's
replacement is taken over even before the scheduler has seen the old pod deleted. Frozen snapshot.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0010_takeover_slot_pod_uid"
down_revision: str | None = "0009_metrics_pool_samples"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("takeover_slot", sa.Column("pod_uid", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("takeover_slot", "pod_uid")

"""`pod_index_seq`: the device-plugin pod index (0..127) the webhook gives each GPU pod it admits.

Revision ID: 0005_pod_index_sequence
Revises: 0004_defrag_campaigns
Create Date: 2026-12-02

A cycling sequence, so concurrent admissions on any number of webhook replicas get distinct indexes
and an index comes back only after 127 other GPU pods were admitted (`tfcommon.device_slots`). `CACHE 1`
keeps the order global across connections. Used only by the webhook (`nextval`). Frozen snapshot.
"""

from __future__ import annotations

from alembic import op

revision: str = "0005_pod_index_sequence"
down_revision: str | None = "0004_defrag_campaigns"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.execute("CREATE SEQUENCE pod_index_seq AS smallint MINVALUE 0 MAXVALUE 127 START WITH 0 CACHE 1 CYCLE")


def downgrade() -> None:
    op.execute("DROP SEQUENCE pod_index_seq")

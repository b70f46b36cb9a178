"""Defrag planner state: per-pool anchor, campaigns and their moves, so a restart resumes.

Revision ID: 0004_defrag_campaigns
Revises: 0003_scheduler_workloads
Create Date: 2026-12-02

`defrag_pool_state.last_defrag_time` is TensorFusion's `status.lastDefragTime`; at most one running
campaign per pool (a partial unique index, besides the planner's advisory lock); one row per move
with the capacity hold taken for the replacement. Written only by the defrag planner. Frozen snapshot.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004_defrag_campaigns"
down_revision: str | None = "0003_scheduler_workloads"
branch_labels: str | None = None
depends_on: str | None = None

CAMPAIGN_STATES = ("running", "finished")
MOVE_STATES = ("evicting", "evicted", "placed", "failed")


def _one_of(column: str, values: tuple[str, ...]) -> str:
    return "{} IN ({})".format(column, ", ".join(f"'{value}'" for value in values))


def upgrade() -> None:
    op.create_table(
        "defrag_pool_state",
        sa.Column("pool_name", sa.Text(), nullable=False),
        sa.Column("last_defrag_time", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.PrimaryKeyConstraint("pool_name", name=op.f("pk_defrag_pool_state")),
    )
    op.create_table(
        "defrag_campaign",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("pool_name", sa.Text(), nullable=False),
        sa.Column("trigger", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=True),
        sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.Column("current_node", sa.Text(), nullable=True),
        sa.Column("drained_nodes", postgresql.JSONB(), nullable=False, server_default=sa.text("'[]'::jsonb")),
        sa.Column("failed_nodes", postgresql.JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("skipped_nodes", postgresql.JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("pods_evicted", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("stranded_pods", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_defrag_campaign")),
        sa.CheckConstraint(_one_of("state", CAMPAIGN_STATES), name=op.f("ck_defrag_campaign_state_known")),
    )
    op.create_index(
        "uq_defrag_campaign_running_pool",
        "defrag_campaign",
        ["pool_name"],
        unique=True,
        postgresql_where=sa.text("state = 'running'"),
    )
    op.create_table(
        "defrag_move",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("campaign_id", sa.Uuid(), nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("pod_namespace", sa.Text(), nullable=False),
        sa.Column("pod_name", sa.Text(), nullable=False),
        sa.Column("pod_uid", sa.Text(), nullable=False),
        sa.Column("owner_uid", sa.Text(), nullable=True),
        sa.Column(
            "siblings_before", postgresql.JSONB(), nullable=False, server_default=sa.text("'[]'::jsonb")
        ),
        sa.Column("target_node", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("hold_allocation_id", sa.Uuid(), nullable=True),
        sa.Column("hold_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("hold_released", sa.Boolean(), nullable=False, server_default=sa.text("false")),
        sa.Column("evicted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("placed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("placed_on", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_defrag_move")),
        sa.ForeignKeyConstraint(
            ["campaign_id"], ["defrag_campaign.id"], name=op.f("fk_defrag_move_campaign_id_defrag_campaign")
        ),
        sa.UniqueConstraint("campaign_id", "pod_uid", name=op.f("uq_defrag_move_campaign_id_pod_uid")),
        sa.CheckConstraint(_one_of("state", MOVE_STATES), name=op.f("ck_defrag_move_state_known")),
    )


def downgrade() -> None:
    op.drop_table("defrag_move")
    op.drop_index("uq_defrag_campaign_running_pool", table_name="defrag_campaign")
    op.drop_table("defrag_campaign")
    op.drop_table("defrag_pool_state")

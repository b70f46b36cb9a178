"""The ledger's first schema: pools, nodes, GPUs, allocations, their append-only history, the outbox.

Revision ID: 0001_initial
Revises:
Create Date: 2026-12-02

A frozen snapshot (it does not import `tables.py`, which keeps evolving); a test checks that the
two agree. `allocation_history` rejects UPDATE, DELETE and TRUNCATE with a trigger; every insert
into `outbox` notifies the `tf_outbox` channel so the relay wakes at commit.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001_initial"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

TIMESTAMP = sa.DateTime(timezone=True)
NOW = sa.text("now()")


def _one_of(column: str, values: tuple[str, ...]) -> str:
    quoted = ", ".join(f"'{value}'" for value in values)
    return f"{column} IN ({quoted})"


def upgrade() -> None:
    op.create_table(
        "pool",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("created_at", TIMESTAMP, server_default=NOW, nullable=False),
        sa.Column("updated_at", TIMESTAMP, server_default=NOW, nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_pool")),
    )
    op.create_table(
        "node",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("pool_name", sa.Text(), nullable=False),
        sa.Column("labels", postgresql.JSONB(), server_default=sa.text("'{}'::jsonb"), nullable=False),
        sa.Column("taints", postgresql.JSONB(), server_default=sa.text("'[]'::jsonb"), nullable=False),
        sa.Column("annotations", postgresql.JSONB(), server_default=sa.text("'{}'::jsonb"), nullable=False),
        sa.Column("cpu_allocatable_milli", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("memory_allocatable_bytes", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("cordoned", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("ready", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("last_heartbeat_at", TIMESTAMP, nullable=True),
        sa.Column("created_at", TIMESTAMP, server_default=NOW, nullable=False),
        sa.Column("updated_at", TIMESTAMP, server_default=NOW, nullable=False),
        sa.CheckConstraint("cpu_allocatable_milli >= 0", name=op.f("ck_node_cpu_allocatable_not_negative")),
        sa.CheckConstraint(
            "memory_allocatable_bytes >= 0", name=op.f("ck_node_memory_allocatable_not_negative")
        ),
        sa.ForeignKeyConstraint(["pool_name"], ["pool.name"], name=op.f("fk_node_pool_name_pool")),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_node")),
    )
    op.create_index("ix_node_pool_name", "node", ["pool_name"])
    op.create_table(
        "gpu",
        sa.Column("uuid", sa.Text(), nullable=False),
        sa.Column("node_name", sa.Text(), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("vendor", sa.Text(), nullable=False),
        sa.Column("capacity_tflops_milli", sa.BigInteger(), nullable=False),
        sa.Column("capacity_vram_bytes", sa.BigInteger(), nullable=False),
        sa.Column("used_tflops_milli", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("used_vram_bytes", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("phase", sa.Text(), server_default=sa.text("'Running'"), nullable=False),
        sa.Column("numa_node", sa.Integer(), nullable=True),
        sa.Column("version", sa.BigInteger(), server_default=sa.text("1"), nullable=False),
        sa.Column("created_at", TIMESTAMP, server_default=NOW, nullable=False),
        sa.Column("updated_at", TIMESTAMP, server_default=NOW, nullable=False),
        sa.CheckConstraint("uuid = lower(uuid)", name=op.f("ck_gpu_uuid_lower_case")),
        sa.CheckConstraint("index >= 0", name=op.f("ck_gpu_index_not_negative")),
        sa.CheckConstraint("used_tflops_milli >= 0", name=op.f("ck_gpu_used_tflops_not_negative")),
        sa.CheckConstraint("used_vram_bytes >= 0", name=op.f("ck_gpu_used_vram_not_negative")),
        sa.CheckConstraint(
            "used_tflops_milli <= capacity_tflops_milli", name=op.f("ck_gpu_used_tflops_within_capacity")
        ),
        sa.CheckConstraint(
            "used_vram_bytes <= capacity_vram_bytes", name=op.f("ck_gpu_used_vram_within_capacity")
        ),
        sa.CheckConstraint(
            _one_of("phase", ("Pending", "Running", "Updating", "Unknown", "Destroying", "Migrating")),
            name=op.f("ck_gpu_phase_known"),
        ),
        sa.ForeignKeyConstraint(["node_name"], ["node.name"], name=op.f("fk_gpu_node_name_node")),
        sa.PrimaryKeyConstraint("uuid", name=op.f("pk_gpu")),
        sa.UniqueConstraint("node_name", "index", name=op.f("uq_gpu_node_name_index")),
    )
    op.create_table(
        "allocation",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("allocation_id", sa.Uuid(), nullable=False),
        sa.Column("gpu_uuid", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("workload_namespace", sa.Text(), nullable=False),
        sa.Column("workload_name", sa.Text(), nullable=False),
        sa.Column("workload_uid", sa.Text(), nullable=True),
        sa.Column("workload_owner", sa.Text(), nullable=True),
        sa.Column("qos", sa.Text(), nullable=False),
        sa.Column("isolation", sa.Text(), nullable=False),
        sa.Column("pool_name", sa.Text(), nullable=False),
        sa.Column("node_name", sa.Text(), nullable=False),
        sa.Column("request_tflops_milli", sa.BigInteger(), nullable=False),
        sa.Column("request_vram_bytes", sa.BigInteger(), nullable=False),
        sa.Column("limit_tflops_milli", sa.BigInteger(), nullable=False),
        sa.Column("limit_vram_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("committed_at", TIMESTAMP, nullable=True),
        sa.Column("released_at", TIMESTAMP, nullable=True),
        sa.Column("release_reason", sa.Text(), nullable=True),
        sa.CheckConstraint(
            _one_of("state", ("reserved", "committed", "released")), name=op.f("ck_allocation_state_known")
        ),
        sa.CheckConstraint(
            _one_of("qos", ("low", "medium", "high", "critical")), name=op.f("ck_allocation_qos_known")
        ),
        sa.CheckConstraint(
            _one_of("isolation", ("shared", "soft", "hard", "partitioned")),
            name=op.f("ck_allocation_isolation_known"),
        ),
        sa.CheckConstraint(
            "request_tflops_milli >= 0", name=op.f("ck_allocation_request_tflops_not_negative")
        ),
        sa.CheckConstraint("request_vram_bytes >= 0", name=op.f("ck_allocation_request_vram_not_negative")),
        sa.CheckConstraint(
            "limit_tflops_milli >= request_tflops_milli",
            name=op.f("ck_allocation_limit_tflops_covers_request"),
        ),
        sa.CheckConstraint(
            "limit_vram_bytes >= request_vram_bytes", name=op.f("ck_allocation_limit_vram_covers_request")
        ),
        sa.CheckConstraint(
            "(state = 'released') = (released_at IS NOT NULL)",
            name=op.f("ck_allocation_released_at_iff_released"),
        ),
        sa.ForeignKeyConstraint(["gpu_uuid"], ["gpu.uuid"], name=op.f("fk_allocation_gpu_uuid_gpu")),
        sa.ForeignKeyConstraint(["node_name"], ["node.name"], name=op.f("fk_allocation_node_name_node")),
        sa.ForeignKeyConstraint(["pool_name"], ["pool.name"], name=op.f("fk_allocation_pool_name_pool")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_allocation")),
        sa.UniqueConstraint("allocation_id", "gpu_uuid", name=op.f("uq_allocation_allocation_id_gpu_uuid")),
    )
    op.create_index(
        "ix_allocation_active_gpu_uuid",
        "allocation",
        ["gpu_uuid"],
        postgresql_where=sa.text("state <> 'released'"),
    )
    op.create_index(
        "ix_allocation_workload_namespace_workload_name",
        "allocation",
        ["workload_namespace", "workload_name"],
    )
    op.create_table(
        "allocation_history",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("allocation_id", sa.Uuid(), nullable=False),
        sa.Column("gpu_uuid", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("occurred_at", TIMESTAMP, nullable=False),
        sa.Column("cause", sa.Uuid(), nullable=True),
        sa.Column("tflops_milli", sa.BigInteger(), nullable=False),
        sa.Column("vram_bytes", sa.BigInteger(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.CheckConstraint(
            _one_of("kind", ("opened", "committed", "released", "evicted")),
            name=op.f("ck_allocation_history_kind_known"),
        ),
        sa.ForeignKeyConstraint(
            ["allocation_id", "gpu_uuid"],
            ["allocation.allocation_id", "allocation.gpu_uuid"],
            name=op.f("fk_allocation_history_allocation"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_allocation_history")),
    )
    op.create_index("ix_allocation_history_allocation_id", "allocation_history", ["allocation_id"])
    op.create_index("ix_allocation_history_occurred_at", "allocation_history", ["occurred_at"])
    op.execute(
        """
        CREATE FUNCTION allocation_history_reject_change() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'allocation_history is append-only: % is not allowed', TG_OP
                USING ERRCODE = 'restrict_violation',
                      HINT = 'record a new history row (released, evicted) instead of changing one';
        END
        $$
        """
    )
    op.execute(
        "CREATE TRIGGER allocation_history_append_only BEFORE UPDATE OR DELETE ON allocation_history "
        "FOR EACH ROW EXECUTE FUNCTION allocation_history_reject_change()"
    )
    op.execute(
        "CREATE TRIGGER allocation_history_no_truncate BEFORE TRUNCATE ON allocation_history "
        "FOR EACH STATEMENT EXECUTE FUNCTION allocation_history_reject_change()"
    )
    op.create_table(
        "outbox",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("event_id", sa.Uuid(), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("event_type", sa.Text(), nullable=False),
        sa.Column("payload", postgresql.JSONB(), nullable=False),
        sa.Column("headers", postgresql.JSONB(), server_default=sa.text("'{}'::jsonb"), nullable=False),
        sa.Column("occurred_at", TIMESTAMP, nullable=False),
        sa.Column("created_at", TIMESTAMP, server_default=NOW, nullable=False),
        sa.Column("published_at", TIMESTAMP, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_outbox")),
        sa.UniqueConstraint("event_id", name=op.f("uq_outbox_event_id")),
    )
    op.create_index(
        "ix_outbox_unpublished_id", "outbox", ["id"], postgresql_where=sa.text("published_at IS NULL")
    )
    op.execute(
        """
        CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('tf_outbox', '');
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        "CREATE TRIGGER outbox_notify AFTER INSERT ON outbox "
        "FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER outbox_notify ON outbox")
    op.execute("DROP FUNCTION outbox_notify()")
    op.drop_table("outbox")
    op.execute("DROP TRIGGER allocation_history_no_truncate ON allocation_history")
    op.execute("DROP TRIGGER allocation_history_append_only ON allocation_history")
    op.execute("DROP FUNCTION allocation_history_reject_change()")
    op.drop_table("allocation_history")
    op.drop_table("allocation")
    op.drop_table("gpu")
    op.drop_table("node")
    op.drop_table("pool")

"""The ledger's tables (SQLAlchemy Core). They never leave `tfcommon.ledger`: callers get `records`.

One writer per table (others only read):

- `pool`: the node agent (registration) and configuration loading.
- `node`: the node agent (registration, heartbeats); the `cordoned` flag: scheduler and defrag planner.
- `gpu`: the node agent (inventory, phase); `used_*` and `version`: only `reserve()` and `release()`.
- `allocation`: the scheduler, through `SqlLedger.reserve/commit/release`.
- `allocation_history`: the same transactions as `allocation`; append-only (a trigger refuses
  UPDATE, DELETE and TRUNCATE).
- `outbox`: the same transactions as the change they announce; `published_at`: the outbox relay.
- `allocation_hold`: whom a defrag capacity hold is for, written with the hold's reservation
  (`SqlLedger.reserve_hold`); `claimed_*`: the scheduler, when the replacement takes the hold
  (`SqlLedger.claim_hold`).

Quantities are integers only: TFLOPS in milli-TFLOPS, memory in bytes; every time is `timestamptz`.
The database enforces capacity (`CHECK used <= capacity`, `used >= 0`), not only Python.
Migration `0001_initial` creates these tables (`0006_metrics_recommendations` adds
`allocation.eviction_protection_s`, `0007_allocation_share_index` adds `allocation.share_index`
and its unique index, `0008_allocation_hold` adds `allocation_hold`); a test compares the migrated
schema with them.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
    Uuid,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

from tfcommon.pod_spec import ISOLATION_MODES, QOS_LEVELS

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

GPU_PHASES = ("Pending", "Running", "Updating", "Unknown", "Destroying", "Migrating")
ALLOCATION_STATES = ("reserved", "committed", "released")
HISTORY_KINDS = ("opened", "committed", "released", "evicted")

metadata = MetaData(naming_convention=NAMING_CONVENTION)


def _one_of(column: str, values: tuple[str, ...]) -> str:
    quoted = ", ".join(f"'{value}'" for value in values)
    return f"{column} IN ({quoted})"


def _created_at() -> Column[datetime]:
    return Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()"))


def _updated_at() -> Column[datetime]:
    return Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()"))


pool = Table(
    "pool",
    metadata,
    Column("name", Text, primary_key=True),
    _created_at(),
    _updated_at(),
)

node = Table(
    "node",
    metadata,
    Column("name", Text, primary_key=True),
    Column("pool_name", Text, ForeignKey("pool.name"), nullable=False),
    Column("labels", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("taints", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("annotations", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("cpu_allocatable_milli", BigInteger, nullable=False, server_default=text("0")),
    Column("memory_allocatable_bytes", BigInteger, nullable=False, server_default=text("0")),
    Column("cordoned", Boolean, nullable=False, server_default=text("false")),
    Column("ready", Boolean, nullable=False, server_default=text("true")),
    Column("last_heartbeat_at", DateTime(timezone=True), nullable=True),
    _created_at(),
    _updated_at(),
    CheckConstraint("cpu_allocatable_milli >= 0", name="cpu_allocatable_not_negative"),
    CheckConstraint("memory_allocatable_bytes >= 0", name="memory_allocatable_not_negative"),
    Index(None, "pool_name"),
)

gpu = Table(
    "gpu",
    metadata,
    Column("uuid", Text, primary_key=True),
    Column("node_name", Text, ForeignKey("node.name"), nullable=False),
    Column("index", Integer, nullable=False),
    Column("model", Text, nullable=False),
    Column("vendor", Text, nullable=False),
    Column("capacity_tflops_milli", BigInteger, nullable=False),
    Column("capacity_vram_bytes", BigInteger, nullable=False),
    Column("used_tflops_milli", BigInteger, nullable=False, server_default=text("0")),
    Column("used_vram_bytes", BigInteger, nullable=False, server_default=text("0")),
    Column("phase", Text, nullable=False, server_default=text("'Running'")),
    Column("numa_node", Integer, nullable=True),
    Column("version", BigInteger, nullable=False, server_default=text("1")),
    _created_at(),
    _updated_at(),
    CheckConstraint("uuid = lower(uuid)", name="uuid_lower_case"),
    CheckConstraint("index >= 0", name="index_not_negative"),
    CheckConstraint("used_tflops_milli >= 0", name="used_tflops_not_negative"),
    CheckConstraint("used_vram_bytes >= 0", name="used_vram_not_negative"),
    CheckConstraint("used_tflops_milli <= capacity_tflops_milli", name="used_tflops_within_capacity"),
    CheckConstraint("used_vram_bytes <= capacity_vram_bytes", name="used_vram_within_capacity"),
    CheckConstraint(_one_of("phase", GPU_PHASES), name="phase_known"),
    UniqueConstraint("node_name", "index"),
)

allocation = Table(
    "allocation",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("allocation_id", Uuid(), nullable=False),
    Column("gpu_uuid", Text, ForeignKey("gpu.uuid"), nullable=False),
    Column("share_index", Integer, nullable=False),
    Column("state", Text, nullable=False),
    Column("workload_namespace", Text, nullable=False),
    Column("workload_name", Text, nullable=False),
    Column("workload_uid", Text, nullable=True),
    Column("workload_owner", Text, nullable=True),
    Column("qos", Text, nullable=False),
    Column("isolation", Text, nullable=False),
    Column("pool_name", Text, ForeignKey("pool.name"), nullable=False),
    Column("node_name", Text, ForeignKey("node.name"), nullable=False),
    Column("request_tflops_milli", BigInteger, nullable=False),
    Column("request_vram_bytes", BigInteger, nullable=False),
    Column("limit_tflops_milli", BigInteger, nullable=False),
    Column("limit_vram_bytes", BigInteger, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("committed_at", DateTime(timezone=True), nullable=True),
    Column("released_at", DateTime(timezone=True), nullable=True),
    Column("release_reason", Text, nullable=True),
    Column("eviction_protection_s", BigInteger, nullable=True),
    CheckConstraint(_one_of("state", ALLOCATION_STATES), name="state_known"),
    CheckConstraint(_one_of("qos", QOS_LEVELS), name="qos_known"),
    CheckConstraint(_one_of("isolation", ISOLATION_MODES), name="isolation_known"),
    CheckConstraint("request_tflops_milli >= 0", name="request_tflops_not_negative"),
    CheckConstraint("request_vram_bytes >= 0", name="request_vram_not_negative"),
    CheckConstraint("limit_tflops_milli >= request_tflops_milli", name="limit_tflops_covers_request"),
    CheckConstraint("limit_vram_bytes >= request_vram_bytes", name="limit_vram_covers_request"),
    CheckConstraint("(state = 'released') = (released_at IS NOT NULL)", name="released_at_iff_released"),
    CheckConstraint("eviction_protection_s >= 0", name="eviction_protection_not_negative"),
    CheckConstraint("share_index >= 0", name="share_index_not_negative"),
    UniqueConstraint("allocation_id", "gpu_uuid"),
    # One reservation per allocation id: two writers reserving it on different GPUs both write share 0.
    UniqueConstraint("allocation_id", "share_index"),
    Index("ix_allocation_active_gpu_uuid", "gpu_uuid", postgresql_where=text("state <> 'released'")),
    Index(None, "workload_namespace", "workload_name"),
)

allocation_history = Table(
    "allocation_history",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("allocation_id", Uuid(), nullable=False),
    Column("gpu_uuid", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("occurred_at", DateTime(timezone=True), nullable=False),
    Column("cause", Uuid(), nullable=True),
    Column("tflops_milli", BigInteger, nullable=False),
    Column("vram_bytes", BigInteger, nullable=False),
    Column("reason", Text, nullable=True),
    CheckConstraint(_one_of("kind", HISTORY_KINDS), name="kind_known"),
    ForeignKeyConstraint(
        ["allocation_id", "gpu_uuid"],
        ["allocation.allocation_id", "allocation.gpu_uuid"],
        name="fk_allocation_history_allocation",
    ),
    Index(None, "allocation_id"),
    Index(None, "occurred_at"),
)

outbox = Table(
    "outbox",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("event_id", Uuid(), nullable=False, unique=True),
    Column("subject", Text, nullable=False),
    Column("event_type", Text, nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("headers", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("occurred_at", DateTime(timezone=True), nullable=False),
    _created_at(),
    Column("published_at", DateTime(timezone=True), nullable=True),
    Index("ix_outbox_unpublished_id", "id", postgresql_where=text("published_at IS NULL")),
)

allocation_hold = Table(
    "allocation_hold",
    metadata,
    Column("allocation_id", Uuid(), primary_key=True),
    Column("pool_name", Text, nullable=False),
    Column("workload_namespace", Text, nullable=False),
    Column("workload_name", Text, nullable=False),
    Column("owner_uid", Text, nullable=True),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    _created_at(),
    Column("claimed_by", Uuid(), nullable=True),
    Column("claimed_at", DateTime(timezone=True), nullable=True),
    CheckConstraint("(claimed_by IS NULL) = (claimed_at IS NULL)", name="claimed_together"),
    Index(
        "ix_allocation_hold_unclaimed_expires_at", "expires_at", postgresql_where=text("claimed_at IS NULL")
    ),
)

OUTBOX_CHANNEL = "tf_outbox"
"""Postgres LISTEN/NOTIFY channel: every outbox insert notifies it so the relay wakes at commit."""

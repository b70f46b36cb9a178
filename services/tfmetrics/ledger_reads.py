"""Reads the ledger for billing: each GPU share's held interval from the append-only allocation history.

A share is held from its `opened` history entry to its `released` or `evicted` entry (none yet: still
held); its eviction-protection window runs from the same `opened` entry for the allocation's
`eviction_protection_s` (recorded at reservation from `tensor-fusion.ai/eviction-protection`).
Read-only: this module never writes to the ledger and makes no billing decisions.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import and_, func, or_, select
from sqlalchemy.ext.asyncio import AsyncEngine
from tfcommon.ledger import tables

from tfmetrics.core.billing import BillableShare


def _protected_until(opened_at: datetime, protection_s: int | None) -> datetime | None:
    return opened_at + timedelta(seconds=protection_s) if protection_s else None


async def billable_shares(engine: AsyncEngine, start: datetime, end: datetime) -> list[BillableShare]:
    """Every GPU share held at some moment in [start, end), oldest first."""
    allocation = tables.allocation.c
    history = tables.allocation_history.c
    opened_at = func.min(history.occurred_at).filter(history.kind == "opened")
    closed_at = func.min(history.occurred_at).filter(history.kind.in_(("released", "evicted")))
    query = (
        select(
            allocation.allocation_id,
            allocation.gpu_uuid,
            allocation.workload_namespace,
            allocation.workload_name,
            allocation.workload_owner,
            allocation.qos,
            allocation.pool_name,
            tables.gpu.c.model,
            allocation.request_tflops_milli,
            allocation.request_vram_bytes,
            allocation.limit_tflops_milli,
            allocation.limit_vram_bytes,
            allocation.eviction_protection_s,
            opened_at.label("opened_at"),
            closed_at.label("closed_at"),
        )
        .select_from(
            tables.allocation.join(
                tables.allocation_history,
                and_(
                    history.allocation_id == allocation.allocation_id, history.gpu_uuid == allocation.gpu_uuid
                ),
            ).join(tables.gpu, tables.gpu.c.uuid == allocation.gpu_uuid)
        )
        .group_by(allocation.id, tables.gpu.c.model)
        .having(and_(opened_at < end, or_(closed_at.is_(None), closed_at > start)))
        .order_by(opened_at, allocation.id)
    )
    async with engine.connect() as connection:
        rows = (await connection.execute(query)).all()
    return [
        BillableShare(
            allocation_id=str(row.allocation_id),
            gpu_uuid=row.gpu_uuid,
            namespace=row.workload_namespace,
            pod=row.workload_name,
            workload=row.workload_owner or row.workload_name,
            qos=row.qos,
            pool=row.pool_name,
            gpu_model=row.model,
            request_tflops_milli=row.request_tflops_milli,
            request_vram_bytes=row.request_vram_bytes,
            limit_tflops_milli=row.limit_tflops_milli,
            limit_vram_bytes=row.limit_vram_bytes,
            start=row.opened_at,
            end=row.closed_at,
            protected_until=_protected_until(row.opened_at, row.eviction_protection_s),
        )
        for row in rows
    ]

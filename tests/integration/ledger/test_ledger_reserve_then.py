"""`SqlLedger.reserve_many(then=...)`: the caller's own record commits with the reservations or not at all.

The scheduler marks its workloads placed this way, in the reservations' transaction (real Postgres).
"""

from __future__ import annotations

from uuid import UUID

import pytest
import sqlalchemy as sa
from tfcommon.ledger import tables
from tfcommon.ledger.records import InsufficientCapacity, Reserved
from tfcommon.ledger.sql import SqlLedger
from tfcommon.ledger.testing import GIB, a_node_with_gpus, a_reservation

pytestmark = pytest.mark.integration

placed_record = sa.table("reserve_then_placed", sa.column("allocation_id", sa.Uuid()))


@pytest.fixture(scope="module")
async def record_table(ledger: SqlLedger) -> None:
    async with ledger.engine.begin() as connection:
        await connection.execute(sa.text("CREATE TABLE reserve_then_placed (allocation_id uuid PRIMARY KEY)"))


def record_reserved(allocation_ids: list[UUID]) -> sa.Insert:
    """Record the ids among `allocation_ids` that the ledger holds: it reads the reservations it follows."""
    allocation = tables.allocation.c
    return sa.insert(placed_record).from_select(
        ["allocation_id"],
        sa.select(allocation.allocation_id)
        .where(allocation.allocation_id.in_(allocation_ids), allocation.state != "released")
        .distinct(),
    )


async def recorded(ledger: SqlLedger, allocation_ids: list[UUID]) -> set[UUID]:
    async with ledger.engine.connect() as connection:
        rows = await connection.scalars(
            sa.select(placed_record.c.allocation_id).where(placed_record.c.allocation_id.in_(allocation_ids))
        )
        return set(rows)


async def active_allocations(ledger: SqlLedger, allocation_ids: list[UUID]) -> set[UUID]:
    return {a.allocation_id for a in await ledger.active_allocations() if a.allocation_id in allocation_ids}


async def test_then_sees_the_batch_reservations_and_commits_with_them(
    ledger: SqlLedger, record_table: None
) -> None:
    node, (gpu,) = await a_node_with_gpus(ledger, tflops_milli=100_000)
    fits, too_big = a_reservation(node, {gpu: (60_000, GIB)}), a_reservation(node, {gpu: (60_000, GIB)})
    ids = [fits.allocation_id, too_big.allocation_id]

    results = await ledger.reserve_many([fits, too_big], commit=True, then=record_reserved(ids))

    assert isinstance(results[0], Reserved)
    assert isinstance(results[1], InsufficientCapacity)
    assert await recorded(ledger, ids) == {fits.allocation_id}


async def test_a_failing_then_leaves_no_reservation_behind(ledger: SqlLedger, record_table: None) -> None:
    node, (gpu,) = await a_node_with_gpus(ledger)
    request = a_reservation(node, {gpu: (10_000, GIB)})
    failing = sa.text("SELECT 1 / 0")

    with pytest.raises(sa.exc.DBAPIError, match="division by zero"):
        await ledger.reserve_many([request], commit=True, then=failing)

    assert await active_allocations(ledger, [request.allocation_id]) == set()
    gpu_now = await ledger.get_gpu(gpu)
    assert gpu_now is not None
    assert gpu_now.used_tflops_milli == 0

"""`SqlLedger.transaction()`: a caller's own statements and a batch of reservations in one commit.

The scheduler records a batch of submissions and reserves those that fit in one such transaction. Its
contract (real Postgres): everything commits together or nothing does, outbox events included; a batch
the ledger cannot finish as one transaction is rolled back whole and says so (`BatchAbandonedError`);
the holds it reads are those `active_holds()` returns.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import pytest
import sqlalchemy as sa
from tfcommon.events import WorkloadRef
from tfcommon.ledger import tables
from tfcommon.ledger.records import HoldFor, InsufficientCapacity, Reserved
from tfcommon.ledger.sql import BatchAbandonedError, SqlLedger
from tfcommon.ledger.testing import GIB, a_node_with_gpus, a_reservation

pytestmark = pytest.mark.integration

callers_record = sa.table("transaction_callers_record", sa.column("note", sa.Text()))


@pytest.fixture(scope="module")
async def record_table(ledger: SqlLedger) -> None:
    async with ledger.engine.begin() as connection:
        await connection.execute(sa.text("CREATE TABLE transaction_callers_record (note text PRIMARY KEY)"))


async def notes(ledger: SqlLedger) -> set[str]:
    async with ledger.engine.connect() as connection:
        return set(await connection.scalars(sa.select(callers_record.c.note)))


async def outbox_events_for(ledger: SqlLedger, allocation_ids: list[UUID]) -> int:
    wanted = [str(allocation_id) for allocation_id in allocation_ids]
    async with ledger.engine.connect() as connection:
        count = await connection.scalar(
            sa.select(sa.func.count())
            .select_from(tables.outbox)
            .where(tables.outbox.c.payload["allocation_id"].astext.in_(wanted))
        )
        return int(count or 0)


async def test_the_callers_statements_and_the_reservations_commit_together(
    ledger: SqlLedger, record_table: None
) -> None:
    node, (gpu,) = await a_node_with_gpus(ledger, tflops_milli=100_000)
    fits, too_big = a_reservation(node, {gpu: (60_000, GIB)}), a_reservation(node, {gpu: (60_000, GIB)})
    note = f"batch-{uuid4()}"

    async with ledger.transaction() as transaction:
        await transaction.connection.execute(sa.insert(callers_record).values(note=note))
        results = await transaction.reserve_many([fits, too_big], commit=True)

    assert isinstance(results[0], Reserved)
    assert results[0].allocation.state == "committed"
    assert isinstance(results[1], InsufficientCapacity)
    assert note in await notes(ledger)
    stored = await ledger.get_allocation(fits.allocation_id)
    assert stored is not None
    assert stored.state == "committed"
    assert await outbox_events_for(ledger, [fits.allocation_id, too_big.allocation_id]) == 1


async def test_an_error_in_the_block_leaves_nothing_behind(ledger: SqlLedger, record_table: None) -> None:
    node, (gpu,) = await a_node_with_gpus(ledger)
    request = a_reservation(node, {gpu: (10_000, GIB)})
    note = f"batch-{uuid4()}"

    async def fail_after_reserving() -> None:
        async with ledger.transaction() as transaction:
            await transaction.connection.execute(sa.insert(callers_record).values(note=note))
            await transaction.reserve_many([request], commit=True)
            raise RuntimeError("the caller failed after reserving")

    with pytest.raises(RuntimeError, match="the caller failed"):
        await fail_after_reserving()

    assert note not in await notes(ledger)
    assert await ledger.get_allocation(request.allocation_id) is None
    assert await outbox_events_for(ledger, [request.allocation_id]) == 0
    gpu_now = await ledger.get_gpu(gpu)
    assert gpu_now is not None
    assert gpu_now.used_tflops_milli == 0


async def test_a_batch_that_cannot_finish_as_one_is_abandoned_whole(
    ledger: SqlLedger, record_table: None
) -> None:
    node, (gpu,) = await a_node_with_gpus(ledger)
    good = a_reservation(node, {gpu: (10_000, GIB)})
    unknown_pool = a_reservation(node, {gpu: (10_000, GIB)}, pool=f"no-such-pool-{uuid4().hex[:6]}")
    note = f"batch-{uuid4()}"

    async def reserve_with_an_unknown_pool() -> None:
        async with ledger.transaction() as transaction:
            await transaction.connection.execute(sa.insert(callers_record).values(note=note))
            await transaction.reserve_many([good, unknown_pool], commit=True)

    with pytest.raises(BatchAbandonedError, match="reservation"):
        await reserve_with_an_unknown_pool()

    assert note not in await notes(ledger)
    assert await ledger.get_allocation(good.allocation_id) is None
    # The same batch through reserve_many(), which redoes it one savepoint per request.
    redone = await ledger.reserve_many([good, unknown_pool], commit=True)
    assert isinstance(redone[0], Reserved)
    assert not isinstance(redone[1], Reserved)


async def test_the_holds_read_in_a_transaction_are_the_active_holds(ledger: SqlLedger) -> None:
    node, (gpu,) = await a_node_with_gpus(ledger)
    hold_id = uuid4()
    hold = a_reservation(node, {gpu: (20_000, GIB)})
    held = await ledger.reserve_hold(
        replace(
            hold,
            allocation_id=hold_id,
            workload=WorkloadRef(namespace="tfpool-defrag", name="hold-team-a-web", uid=str(hold_id)),
        ),
        HoldFor(
            pool="default",
            namespace="team-a",
            name="web",
            owner_uid=None,
            expires_at=datetime.now(UTC) + timedelta(minutes=5),
        ),
    )
    assert isinstance(held, Reserved)

    async with ledger.transaction() as transaction:
        inside = await transaction.active_holds()

    assert hold_id in {h.allocation.allocation_id for h in inside}
    assert inside == await ledger.active_holds()

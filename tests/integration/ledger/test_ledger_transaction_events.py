"""`LedgerTransaction.release()` and `announce()`: an eviction and its event as one committed fact.

What the scheduler and the defrag planner rely on (real Postgres): a release made in the caller's
transaction, the event it announces there and its own rows commit together or not at all; an event id
is announced once, whoever announces it again.
"""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID, uuid4, uuid5

import pytest
import sqlalchemy as sa
from tfcommon.events import PodEvicted, WorkloadRef
from tfcommon.ledger import tables
from tfcommon.ledger.records import LedgerInputError, Reserved
from tfcommon.ledger.sql import SqlLedger
from tfcommon.ledger.testing import GIB, a_node_with_gpus, a_reservation

pytestmark = pytest.mark.integration


async def a_committed_allocation(ledger: SqlLedger) -> tuple[UUID, WorkloadRef, str, str]:
    node, (gpu,) = await a_node_with_gpus(ledger, tflops_milli=100_000)
    request = a_reservation(node, {gpu: (40_000, 8 * GIB)})
    result = await ledger.reserve(request, commit=True)
    assert isinstance(result, Reserved)
    return request.allocation_id, request.workload, node, gpu


def evicted(allocation_id: UUID, workload: WorkloadRef, node: str) -> PodEvicted:
    return PodEvicted(
        event_id=uuid5(allocation_id, "evicted"),
        occurred_at=datetime.now(UTC),
        workload=workload,
        node=node,
        pool="default",
        by="drain",
        reason="node maintenance",
        allocation_id=allocation_id,
    )


async def outbox_subjects(ledger: SqlLedger, allocation_id: UUID) -> list[str]:
    async with ledger.engine.connect() as connection:
        rows = await connection.execute(
            sa.select(tables.outbox.c.subject)
            .where(tables.outbox.c.payload["allocation_id"].astext == str(allocation_id))
            .order_by(tables.outbox.c.id)
        )
        return [subject for (subject,) in rows]


async def test_a_release_and_its_event_commit_together_and_the_event_is_announced_once(
    ledger: SqlLedger,
) -> None:
    allocation_id, workload, node, gpu = await a_committed_allocation(ledger)
    event = evicted(allocation_id, workload, node)

    async with ledger.transaction() as transaction:
        assert await transaction.release(allocation_id, "node maintenance", evicted=True)
        assert await transaction.announce(event) == 1
        assert await transaction.announce(event) == 0, "the same event id is announced once"
    async with ledger.transaction() as transaction:
        assert not await transaction.release(allocation_id, "node maintenance", evicted=True)
        assert await transaction.announce(evicted(allocation_id, workload, node)) == 0
        assert await transaction.announce() == 0

    assert await outbox_subjects(ledger, allocation_id) == [
        "tf.evt.allocation.created",
        "tf.evt.allocation.released",
        "tf.evt.pod.evicted",
    ]
    assert [entry.kind for entry in await ledger.history(allocation_id)] == ["opened", "committed", "evicted"]
    stored = await ledger.get_gpu(gpu)
    assert stored is not None
    assert stored.used_tflops_milli == 0


async def test_a_block_that_fails_after_releasing_leaves_the_allocation_and_announces_nothing(
    ledger: SqlLedger,
) -> None:
    allocation_id, workload, node, gpu = await a_committed_allocation(ledger)

    async def fail_after_releasing() -> None:
        async with ledger.transaction() as transaction:
            assert await transaction.release(allocation_id, "node maintenance", evicted=True)
            await transaction.announce(evicted(allocation_id, workload, node))
            raise RuntimeError("the caller failed after releasing")

    with pytest.raises(RuntimeError, match="the caller failed"):
        await fail_after_releasing()

    kept = await ledger.get_allocation(allocation_id)
    assert kept is not None
    assert kept.state == "committed"
    assert await outbox_subjects(ledger, allocation_id) == ["tf.evt.allocation.created"]
    assert [entry.kind for entry in await ledger.history(allocation_id)] == ["opened", "committed"]
    stored = await ledger.get_gpu(gpu)
    assert stored is not None
    assert stored.used_tflops_milli == 40_000


async def test_a_release_without_a_reason_is_refused_naming_the_field(ledger: SqlLedger) -> None:
    async def release_without_a_reason() -> None:
        async with ledger.transaction() as transaction:
            await transaction.release(uuid4(), "")

    with pytest.raises(LedgerInputError, match="reason: empty"):
        await release_without_a_reason()

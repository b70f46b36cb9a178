"""`release()` and `commit()` are idempotent; the database refuses over-allocation and history edits."""

from __future__ import annotations

import asyncio
from uuid import UUID, uuid4

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import DBAPIError, IntegrityError
from tfcommon.events import AllocationReleased
from tfcommon.ledger import tables
from tfcommon.ledger.records import AllocationRecord, Reserved
from tfcommon.ledger.sql import SqlLedger
from tfcommon.ledger.testing import GIB, a_node_with_gpus, a_reservation

pytestmark = pytest.mark.integration


async def reserved_allocation(ledger: SqlLedger, gpus: int = 1) -> tuple[AllocationRecord, list[str]]:
    node, uuids = await a_node_with_gpus(ledger, gpus=gpus)
    result = await ledger.reserve(a_reservation(node, dict.fromkeys(uuids, (20000, 16 * GIB))))
    assert isinstance(result, Reserved)
    return result.allocation, uuids


async def outbox_rows(ledger: SqlLedger, subject: str, allocation_id: UUID) -> list[dict[str, object]]:
    async with ledger.engine.connect() as connection:
        rows = await connection.execute(
            select(tables.outbox.c.payload).where(
                tables.outbox.c.subject == subject,
                tables.outbox.c.payload["allocation_id"].astext == str(allocation_id),
            )
        )
        return [row.payload for row in rows]


async def test_release_gives_capacity_back_once_and_announces_it_once(ledger: SqlLedger) -> None:
    allocation, (gpu,) = await reserved_allocation(ledger)
    cause = uuid4()

    first = await ledger.release(allocation.allocation_id, "pod-deleted", cause)
    second = await ledger.release(allocation.allocation_id, "pod-deleted", uuid4())

    assert (first, second) == (True, False)
    stored = await ledger.get_gpu(gpu)
    assert stored is not None
    assert (stored.used_tflops_milli, stored.used_vram_bytes) == (0, 0)
    released = await ledger.get_allocation(allocation.allocation_id)
    assert released is not None
    assert (released.state, released.release_reason) == ("released", "pod-deleted")
    assert released.released_at is not None
    assert allocation.allocation_id not in {
        active.allocation_id for active in await ledger.active_allocations()
    }
    history = await ledger.history(allocation.allocation_id)
    assert [(entry.kind, entry.cause, entry.reason) for entry in history] == [
        ("opened", history[0].cause, None),
        ("released", cause, "pod-deleted"),
    ]
    (payload,) = await outbox_rows(ledger, "tf.evt.allocation.released", allocation.allocation_id)
    event = AllocationReleased.model_validate(payload)
    assert (event.reason, event.cause, event.node) == ("pod-deleted", cause, allocation.node)
    assert event.workload == allocation.workload
    assert event.evicted is False


async def test_racing_releases_of_one_allocation_succeed_exactly_once(ledger: SqlLedger) -> None:
    allocation, gpus = await reserved_allocation(ledger, gpus=2)

    results = await asyncio.gather(
        *(ledger.release(allocation.allocation_id, "finished", uuid4()) for _ in range(6))
    )

    assert sorted(results) == [False] * 5 + [True]
    for gpu in gpus:
        stored = await ledger.get_gpu(gpu)
        assert stored is not None
        assert (stored.used_tflops_milli, stored.used_vram_bytes) == (0, 0)
    assert len(await outbox_rows(ledger, "tf.evt.allocation.released", allocation.allocation_id)) == 1


async def test_releasing_an_unknown_allocation_changes_nothing(ledger: SqlLedger) -> None:
    assert await ledger.release(uuid4(), "pod-deleted") is False


async def test_an_eviction_is_recorded_and_announced_as_such(ledger: SqlLedger) -> None:
    allocation, _ = await reserved_allocation(ledger)

    assert await ledger.release(allocation.allocation_id, "evicted by defrag", uuid4(), evicted=True)

    assert [entry.kind for entry in await ledger.history(allocation.allocation_id)] == ["opened", "evicted"]
    (payload,) = await outbox_rows(ledger, "tf.evt.allocation.released", allocation.allocation_id)
    assert AllocationReleased.model_validate(payload).evicted is True


async def test_commit_marks_a_reservation_bound_once(ledger: SqlLedger) -> None:
    allocation, _ = await reserved_allocation(ledger)
    cause = uuid4()

    assert await ledger.commit(allocation.allocation_id, cause) is True
    assert await ledger.commit(allocation.allocation_id, uuid4()) is False

    committed = await ledger.get_allocation(allocation.allocation_id)
    assert committed is not None
    assert committed.state == "committed"
    assert committed.committed_at is not None
    history = await ledger.history(allocation.allocation_id)
    assert [(entry.kind, entry.cause) for entry in history][1:] == [("committed", cause)]


async def test_the_check_constraint_refuses_used_above_capacity_even_for_raw_sql(ledger: SqlLedger) -> None:
    _, (gpu,) = await reserved_allocation(ledger)

    for statement, constraint in [
        ("UPDATE gpu SET used_vram_bytes = capacity_vram_bytes + 1", "ck_gpu_used_vram_within_capacity"),
        (
            "UPDATE gpu SET used_tflops_milli = capacity_tflops_milli + 1",
            "ck_gpu_used_tflops_within_capacity",
        ),
        ("UPDATE gpu SET used_vram_bytes = -1", "ck_gpu_used_vram_not_negative"),
        ("UPDATE gpu SET used_tflops_milli = -1", "ck_gpu_used_tflops_not_negative"),
    ]:
        with pytest.raises(IntegrityError) as refused:
            async with ledger.engine.begin() as connection:
                await connection.execute(text(f"{statement} WHERE uuid = :uuid"), {"uuid": gpu})
        assert f'violates check constraint "{constraint}"' in str(refused.value)

    stored = await ledger.get_gpu(gpu)
    assert stored is not None
    assert (stored.used_tflops_milli, stored.used_vram_bytes) == (20_000, 16 * GIB)


@pytest.mark.parametrize(
    "statement",
    [
        pytest.param("UPDATE allocation_history SET kind = 'released'", id="update"),
        pytest.param("DELETE FROM allocation_history", id="delete"),
        pytest.param("TRUNCATE allocation_history CASCADE", id="truncate"),
    ],
)
async def test_history_is_append_only(ledger: SqlLedger, statement: str) -> None:
    allocation, _ = await reserved_allocation(ledger)
    filtered = statement if statement.startswith("TRUNCATE") else f"{statement} WHERE allocation_id = :id"

    with pytest.raises(DBAPIError) as refused:
        async with ledger.engine.begin() as connection:
            await connection.execute(text(filtered), {"id": allocation.allocation_id})

    assert "allocation_history is append-only" in str(refused.value)
    async with ledger.engine.connect() as connection:
        count = await connection.scalar(
            select(func.count())
            .select_from(tables.allocation_history)
            .where(tables.allocation_history.c.allocation_id == allocation.allocation_id)
        )
    assert count == 1

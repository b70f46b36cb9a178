"""`SqlLedger.reserve()` on real Postgres: racing writers never over-allocate; refusals explain themselves."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from sqlalchemy import select
from tfcommon.events import AllocationCreated
from tfcommon.ledger import tables
from tfcommon.ledger.records import (
    HistoryRecord,
    InsufficientCapacity,
    NodeSpec,
    ReservationRejected,
    ReservationResult,
    Reserved,
)
from tfcommon.ledger.sql import SqlLedger
from tfcommon.ledger.testing import GIB, a_node_with_gpus, a_reservation
from tfdefrag.core.markers import clear_source_markers, source_markers

pytestmark = pytest.mark.integration

SHARE_TFLOPS = 10_000
SHARE_VRAM = 8 * GIB


@pytest.fixture(scope="module")
async def second_ledger(ledger_database_url: str) -> AsyncIterator[SqlLedger]:
    """Another process's view of the same database (its own connection pool)."""
    other = SqlLedger.create(ledger_database_url, pool_size=10)
    try:
        yield other
    finally:
        await other.close()


def replay_peak_usage(history: Sequence[HistoryRecord]) -> dict[str, tuple[int, int]]:
    """Replay opened/released entries in order; the highest TFLOPS and VRAM each GPU ever held."""
    held: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    peak: dict[str, tuple[int, int]] = {}
    for entry in history:
        sign = {"opened": 1, "released": -1, "evicted": -1}.get(entry.kind, 0)
        held[entry.gpu_uuid][0] += sign * entry.tflops_milli
        held[entry.gpu_uuid][1] += sign * entry.vram_bytes
        previous = peak.get(entry.gpu_uuid, (0, 0))
        peak[entry.gpu_uuid] = (
            max(previous[0], held[entry.gpu_uuid][0]),
            max(previous[1], held[entry.gpu_uuid][1]),
        )
    return peak


async def test_sixteen_racing_reservations_for_room_for_ten_yield_exactly_ten(
    ledger: SqlLedger, second_ledger: SqlLedger
) -> None:
    node, (gpu,) = await a_node_with_gpus(ledger, tflops_milli=10 * SHARE_TFLOPS, vram_bytes=80 * GIB)
    requests = [a_reservation(node, {gpu: (SHARE_TFLOPS, SHARE_VRAM)}) for _ in range(16)]

    results: list[ReservationResult] = await asyncio.gather(
        *((ledger if index % 2 else second_ledger).reserve(request) for index, request in enumerate(requests))
    )

    reserved = [result for result in results if isinstance(result, Reserved)]
    refused = [result for result in results if isinstance(result, InsufficientCapacity)]
    assert (len(reserved), len(refused)) == (10, 6)
    assert all(not result.replayed for result in reserved)
    for refusal in refused:
        assert refusal.gpu_uuid == gpu
        assert refusal.message.startswith(f"insufficient capacity on GPU {gpu}:")
    stored = await ledger.get_gpu(gpu)
    assert stored is not None
    assert (stored.used_tflops_milli, stored.used_vram_bytes) == (10 * SHARE_TFLOPS, 10 * SHARE_VRAM)
    assert stored.used_tflops_milli <= stored.capacity_tflops_milli

    winners = {result.allocation.allocation_id for result in reserved}
    history = [entry for entry in await ledger.history() if entry.gpu_uuid == gpu]
    assert {entry.allocation_id for entry in history} == winners
    assert [entry.kind for entry in history] == ["opened"] * 10
    peak_tflops, peak_vram = replay_peak_usage(history)[gpu]
    assert peak_tflops <= stored.capacity_tflops_milli
    assert peak_vram <= stored.capacity_vram_bytes
    active = {allocation.allocation_id for allocation in await ledger.active_allocations()}
    assert winners <= active
    assert not {request.allocation_id for request in requests} - winners & active


async def test_each_reservation_writes_one_allocation_created_event_to_the_outbox(ledger: SqlLedger) -> None:
    node, (gpu,) = await a_node_with_gpus(ledger)
    request = a_reservation(node, {gpu: (SHARE_TFLOPS, SHARE_VRAM)})

    result = await ledger.reserve(request)

    assert isinstance(result, Reserved)
    async with ledger.engine.connect() as connection:
        rows = (
            await connection.execute(
                select(tables.outbox).where(
                    tables.outbox.c.payload["allocation_id"].astext == str(request.allocation_id)
                )
            )
        ).all()
    assert len(rows) == 1
    event = AllocationCreated.model_validate(rows[0].payload)
    assert rows[0].subject == "tf.evt.allocation.created"
    assert rows[0].event_id == event.event_id
    assert rows[0].published_at is None
    assert event.cause == request.cause
    assert event.workload == request.workload
    assert (event.pool, event.node, event.qos, event.isolation) == ("default", node, "medium", "soft")
    assert [(share.gpu_uuid, share.tflops_milli, share.vram_bytes) for share in event.shares] == [
        (gpu, SHARE_TFLOPS, SHARE_VRAM)
    ]


async def test_a_multi_gpu_reservation_is_all_or_nothing(ledger: SqlLedger) -> None:
    node, (roomy, full) = await a_node_with_gpus(ledger, gpus=2, vram_bytes=16 * GIB)
    assert isinstance(await ledger.reserve(a_reservation(node, {full: (0, 12 * GIB)})), Reserved)

    result = await ledger.reserve(a_reservation(node, {roomy: (1000, 8 * GIB), full: (1000, 8 * GIB)}))

    assert result == InsufficientCapacity(
        gpu_uuid=full, resource="vram", requested=8 * GIB, available=4 * GIB, capacity=16 * GIB
    )
    untouched = await ledger.get_gpu(roomy)
    assert untouched is not None
    assert (untouched.used_tflops_milli, untouched.used_vram_bytes, untouched.version) == (0, 0, 1)


async def test_a_multi_gpu_reservation_takes_every_share(ledger: SqlLedger) -> None:
    node, gpus = await a_node_with_gpus(ledger, gpus=4)
    request = a_reservation(node, dict.fromkeys(gpus, (25000, 20 * GIB)))

    result = await ledger.reserve(request)

    assert isinstance(result, Reserved)
    assert [share.gpu_uuid for share in result.allocation.shares] == sorted(gpus)
    for gpu in gpus:
        stored = await ledger.get_gpu(gpu)
        assert stored is not None
        assert (stored.used_tflops_milli, stored.used_vram_bytes) == (25_000, 20 * GIB)


async def test_reserving_the_same_allocation_twice_takes_capacity_once(ledger: SqlLedger) -> None:
    node, (gpu,) = await a_node_with_gpus(ledger)
    request = a_reservation(node, {gpu: (SHARE_TFLOPS, SHARE_VRAM)})

    first, again, racing = (
        await ledger.reserve(request),
        await ledger.reserve(request),
        await asyncio.gather(ledger.reserve(replace(request)), ledger.reserve(replace(request))),
    )

    assert isinstance(first, Reserved)
    assert not first.replayed
    assert again == Reserved(allocation=first.allocation, replayed=True)
    assert all(isinstance(result, Reserved) and result.replayed for result in racing)
    stored = await ledger.get_gpu(gpu)
    assert stored is not None
    assert (stored.used_tflops_milli, stored.used_vram_bytes) == (SHARE_TFLOPS, SHARE_VRAM)
    assert len(await ledger.history(request.allocation_id)) == 1


async def test_racing_retries_of_one_allocation_take_capacity_once(ledger: SqlLedger) -> None:
    node, (gpu,) = await a_node_with_gpus(ledger)
    request = a_reservation(node, {gpu: (SHARE_TFLOPS, SHARE_VRAM)})

    results = await asyncio.gather(*(ledger.reserve(replace(request)) for _ in range(8)))

    assert all(isinstance(result, Reserved) for result in results)
    assert sum(not result.replayed for result in results if isinstance(result, Reserved)) == 1
    stored = await ledger.get_gpu(gpu)
    assert stored is not None
    assert (stored.used_tflops_milli, stored.used_vram_bytes) == (SHARE_TFLOPS, SHARE_VRAM)


async def test_unusable_targets_are_rejected_with_the_field_to_fix(ledger: SqlLedger) -> None:
    node, (gpu, lost) = await a_node_with_gpus(ledger, gpus=2)
    other_node, _ = await a_node_with_gpus(ledger)
    assert await ledger.set_gpu_phase(lost, "Unknown")

    unknown_gpu = await ledger.reserve(a_reservation(node, {"gpu-does-not-exist": (1, 1)}))
    wrong_node = await ledger.reserve(a_reservation(other_node, {gpu: (1, 1)}))
    not_running = await ledger.reserve(a_reservation(node, {lost: (1, 1)}))
    unknown_pool = await ledger.reserve(a_reservation(node, {gpu: (1, 1)}, pool="no-such-pool"))

    assert unknown_gpu == ReservationRejected(
        field="shares[].gpu_uuid",
        message="GPU gpu-does-not-exist is not in the ledger; pick a registered GPU",
    )
    assert wrong_node == ReservationRejected(
        field="node", message=f"GPU {gpu} is on node {node!r}, not {other_node!r}"
    )
    assert not_running == ReservationRejected(
        field="shares[].gpu_uuid",
        message=f"GPU {lost} is Unknown, not Running; it cannot take new allocations",
    )
    assert unknown_pool == ReservationRejected(
        field="pool", message="pool 'no-such-pool' is not in the ledger; register it first"
    )
    stored = await ledger.get_gpu(gpu)
    assert stored is not None
    assert (stored.used_tflops_milli, stored.used_vram_bytes) == (0, 0)


async def test_a_batch_commits_what_fits_and_refuses_the_rest_one_by_one(ledger: SqlLedger) -> None:
    node, (gpu,) = await a_node_with_gpus(ledger, tflops_milli=100_000, vram_bytes=40 * GIB)
    sizes = [10 * GIB, 10 * GIB, 30 * GIB, 10 * GIB, 10 * GIB]
    requests = [a_reservation(node, {gpu: (1000, size)}) for size in sizes]

    results = await ledger.reserve_many([*requests, requests[0]])

    assert [type(result).__name__ for result in results] == [
        "Reserved",
        "Reserved",
        "InsufficientCapacity",
        "Reserved",
        "Reserved",
        "Reserved",
    ]
    assert isinstance(results[-1], Reserved)
    assert results[-1].replayed
    stored = await ledger.get_gpu(gpu)
    assert stored is not None
    assert (stored.used_tflops_milli, stored.used_vram_bytes) == (4000, 40 * GIB)
    history = [entry for entry in await ledger.history() if entry.gpu_uuid == gpu]
    assert len(history) == 4


async def test_racing_batches_over_the_same_gpus_in_opposite_orders_never_over_allocate(
    ledger: SqlLedger, second_ledger: SqlLedger
) -> None:
    node, gpus = await a_node_with_gpus(ledger, gpus=4, tflops_milli=100_000, vram_bytes=80 * GIB)
    forward = [a_reservation(node, {gpu: (10_000, 8 * GIB)}) for gpu in gpus * 4]
    backward = [a_reservation(node, {gpu: (10_000, 8 * GIB)}) for gpu in reversed(gpus * 4)]
    paired = [a_reservation(node, {gpus[0]: (10_000, 8 * GIB), gpus[3]: (10_000, 8 * GIB)}) for _ in range(4)]

    batches = await asyncio.gather(
        ledger.reserve_many(forward), second_ledger.reserve_many(backward), ledger.reserve_many(paired)
    )

    reserved_per_gpu: dict[str, int] = defaultdict(int)
    for result in (result for batch in batches for result in batch):
        if isinstance(result, Reserved):
            for share in result.allocation.shares:
                reserved_per_gpu[share.gpu_uuid] += 1
    # Demand: 12 shares on the first and last GPU (room for 10), 8 on the middle two.
    assert [reserved_per_gpu[gpu] for gpu in gpus] == [10, 8, 8, 10]
    for gpu in gpus:
        stored = await ledger.get_gpu(gpu)
        assert stored is not None
        assert stored.used_tflops_milli == reserved_per_gpu[gpu] * 10_000
        assert stored.used_vram_bytes == reserved_per_gpu[gpu] * 8 * GIB


async def test_a_node_the_defrag_planner_drains_takes_no_new_reservation_even_after_it_registers_again(
    ledger: SqlLedger,
) -> None:
    node, (gpu,) = await a_node_with_gpus(ledger)
    assert await ledger.set_node_markers(node, *source_markers("default", datetime.now(UTC)))
    [registered] = [known for known in await ledger.list_nodes() if known.name == node]
    await ledger.upsert_node(
        NodeSpec(name=node, pool=registered.pool, labels={"zone": "b"}, annotations={"agent": "v2"})
    )

    refused = await ledger.reserve(a_reservation(node, {gpu: (1, 1)}))

    assert refused == ReservationRejected(
        field="node",
        message=f"node {node!r} is being drained by the defrag planner (tensor-fusion.ai/defrag-source); "
        "pick another node",
    )
    [node_row] = [known for known in await ledger.list_nodes() if known.name == node]
    assert node_row.labels == {"zone": "b", "tensor-fusion.ai/defrag-source": "true"}
    assert set(node_row.annotations) == {
        "agent",
        "tensor-fusion.ai/defrag-source-since",
        "tensor-fusion.ai/defrag-source-pool",
    }
    assert await ledger.set_node_markers(node, *clear_source_markers())
    assert not await ledger.set_node_markers(f"{node}-gone", *clear_source_markers())
    assert isinstance(await ledger.reserve(a_reservation(node, {gpu: (1, 1)})), Reserved)


async def test_a_cordoned_node_takes_no_new_reservation_until_uncordoned(ledger: SqlLedger) -> None:
    node, (gpu,) = await a_node_with_gpus(ledger)
    assert await ledger.set_node_cordoned(node, True)

    refused = await ledger.reserve(a_reservation(node, {gpu: (1, 1)}))

    assert refused == ReservationRejected(
        field="node", message=f"node {node!r} is cordoned; pick another node or uncordon it"
    )
    assert await ledger.set_node_cordoned(node, False)
    assert isinstance(await ledger.reserve(a_reservation(node, {gpu: (1, 1)})), Reserved)

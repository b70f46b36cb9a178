"""The ledger refuses a second reservation of one workload: the same allocation id reserved at once by
two writers on different GPUs ends with one allocation, one `AllocationCreated` and one GPU charged;
and the unique index on `(allocation_id, share_index)` refuses a hand-written second reservation."""

from __future__ import annotations

import asyncio
from uuid import UUID, uuid4

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from tfcommon.events import WorkloadRef
from tfcommon.ledger import tables
from tfcommon.ledger.records import ReservationRequest, Reserved, ShareRequest
from tfcommon.ledger.sql import SqlLedger
from tfscheduler.bench import register_simulated_nodes

pytestmark = pytest.mark.integration


def _on(gpu: str, allocation_id: UUID, node: str) -> ReservationRequest:
    return ReservationRequest(
        allocation_id=allocation_id,
        workload=WorkloadRef(namespace="team-a", name="trainer", uid="u-1"),
        pool="default",
        node=node,
        shares=(ShareRequest(gpu_uuid=gpu, tflops_milli=10_000, vram_bytes=1024),),
    )


async def test_one_workload_reserved_on_different_gpus_at_once_holds_one_allocation(
    database_url: str, ledger: SqlLedger
) -> None:
    await register_simulated_nodes(ledger, nodes=1, gpus_per_node=8, prefix="guard")
    second = SqlLedger.create(database_url, pool_size=2)
    try:
        for _round in range(10):
            allocation_id = uuid4()
            results = await asyncio.gather(
                *(
                    writer.reserve(_on(f"guard-gpu-0-{index}", allocation_id, "guard-node-0"), commit=True)
                    for index, writer in enumerate([ledger, second, ledger, second])
                )
            )
            assert all(isinstance(result, Reserved) for result in results)
            assert sum(not result.replayed for result in results if isinstance(result, Reserved)) == 1
            async with ledger.engine.connect() as connection:
                rows = (
                    await connection.execute(
                        sa.select(tables.allocation).where(tables.allocation.c.allocation_id == allocation_id)
                    )
                ).all()
                events = (
                    await connection.execute(
                        sa.select(sa.func.count())
                        .select_from(tables.outbox)
                        .where(tables.outbox.c.payload["allocation_id"].astext == str(allocation_id))
                    )
                ).scalar_one()
            assert len(rows) == 1
            assert events == 1
        charged = sum(gpu.used_tflops_milli for gpu in await ledger.list_gpus())
        assert charged == 10 * 10_000
    finally:
        await second.close()


async def test_the_database_refuses_a_second_reservation_row_set_for_one_allocation_id(
    ledger: SqlLedger,
) -> None:
    await register_simulated_nodes(ledger, nodes=1, gpus_per_node=2, prefix="index")
    allocation_id = uuid4()
    assert isinstance(await ledger.reserve(_on("index-gpu-0-0", allocation_id, "index-node-0")), Reserved)
    row = {
        "allocation_id": allocation_id,
        "gpu_uuid": "index-gpu-0-1",
        "share_index": 0,
        "state": "reserved",
        "workload_namespace": "team-a",
        "workload_name": "trainer",
        "qos": "medium",
        "isolation": "soft",
        "pool_name": "default",
        "node_name": "index-node-0",
        "request_tflops_milli": 1,
        "request_vram_bytes": 1,
        "limit_tflops_milli": 1,
        "limit_vram_bytes": 1,
        "created_at": sa.func.now(),
    }
    with pytest.raises(IntegrityError, match="uq_allocation_allocation_id_share_index"):
        async with ledger.engine.begin() as connection:
            await connection.execute(sa.insert(tables.allocation).values(row))

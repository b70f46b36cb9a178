"""Ledger reservations per second (`tfctl bench ledger`), against a bare INSERT in the same run.

`measure_ledger(database_url, ...)` works on a migrated database: it registers a pool of simulated
GPUs, then makes `reservations` reservations of 2 TFLOPS / 2 GiB with `SqlLedger.reserve` one at a
time, with `SqlLedger.reserve` from `concurrency` callers at once, and with `SqlLedger.reserve_many`
in batches of `batch`. Before each mode it runs its baseline on the same connection pool: a bare
`INSERT ... RETURNING` of the reservation's event payload into a scratch table, shaped the same (one
per transaction, as many callers, or `batch` rows per transaction). Every reservation must come
back `Reserved`; the allocation and outbox rows are then counted. `run_ledger_benchmark(...)` adds the
servers (embedded unless URLs are given) and a scratch database. This module only measures.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar
from uuid import uuid4

from sqlalchemy import BigInteger, Column, Identity, MetaData, Table, Uuid, func, insert, select, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncEngine
from tfcommon.events import AllocationCreated, GpuShare, WorkloadRef
from tfcommon.ledger import tables
from tfcommon.ledger.records import ReservationRequest, Reserved, ShareRequest
from tfcommon.ledger.sql import SqlLedger

from tfctl.bench_servers import postgres_server, scratch_database

GIB = 1024**3
GPU_TFLOPS_MILLI = 100_000
GPU_VRAM_BYTES = 80 * GIB
SHARE_TFLOPS_MILLI = 2_000
SHARE_VRAM_BYTES = 2 * GIB
SHARES_PER_GPU = GPU_VRAM_BYTES // SHARE_VRAM_BYTES
GPUS_PER_NODE = 8
POOL_SIZE = 10
"""Connections per pool, as `TF_DATABASE_POOL_SIZE` gives each service by default."""
MODES = ("one_at_a_time", "concurrent", "batched")
DEFAULT_RESERVATIONS = 500
DEFAULT_CONCURRENCY = 16
DEFAULT_BATCH = 50

Item = TypeVar("Item")


class LedgerBenchmarkError(ValueError):
    """A parameter is out of range, or the ledger did not make every reservation asked for."""


def _check(reservations: int, concurrency: int, batch: int) -> None:
    if reservations < 1:
        raise LedgerBenchmarkError(f"--reservations: {reservations}; give at least 1 per mode")
    if concurrency < 1:
        raise LedgerBenchmarkError(f"--concurrency: {concurrency}; give at least 1 caller")
    if batch < 1:
        raise LedgerBenchmarkError(f"--batch: {batch}; give at least 1 reservation per transaction")


async def _register_gpus(ledger: SqlLedger, pool: str, gpus: int) -> list[tuple[str, str]]:
    """Ready nodes of H100-sized GPUs in `pool`, inserted in bulk; returns `(node, gpu uuid)` per GPU."""
    now = datetime.now(UTC)
    placed = [
        (f"{pool}-node-{n // GPUS_PER_NODE}", f"{pool}-gpu-{n}", n % GPUS_PER_NODE) for n in range(gpus)
    ]
    await ledger.upsert_pool(pool)
    async with ledger.engine.begin() as connection:
        await connection.execute(
            insert(tables.node),
            [
                {"name": node, "pool_name": pool, "last_heartbeat_at": now}
                for node in dict.fromkeys(node for node, _, _ in placed)
            ],
        )
        await connection.execute(
            insert(tables.gpu),
            [
                {
                    "uuid": gpu,
                    "node_name": node,
                    "index": index,
                    "model": "H100",
                    "vendor": "NVIDIA",
                    "capacity_tflops_milli": GPU_TFLOPS_MILLI,
                    "capacity_vram_bytes": GPU_VRAM_BYTES,
                }
                for node, gpu, index in placed
            ],
        )
    return [(node, gpu) for node, gpu, _ in placed]


def _requests(pool: str, gpus: Sequence[tuple[str, str]], start: int, count: int) -> list[ReservationRequest]:
    """Reservation `k` goes to GPU `k mod len(gpus)`, so concurrent callers rarely wait on one row."""
    requests = []
    for k in range(start, start + count):
        node, gpu = gpus[k % len(gpus)]
        requests.append(
            ReservationRequest(
                allocation_id=uuid4(),
                workload=WorkloadRef(namespace="bench-ledger", name=f"{pool}-{k}", uid=str(uuid4())),
                pool=pool,
                node=node,
                shares=(
                    ShareRequest(gpu_uuid=gpu, tflops_milli=SHARE_TFLOPS_MILLI, vram_bytes=SHARE_VRAM_BYTES),
                ),
            )
        )
    return requests


def _event_payload(request: ReservationRequest) -> dict[str, Any]:
    """What the ledger writes to its outbox for this reservation (the baseline inserts the same JSON)."""
    event = AllocationCreated(
        event_id=uuid4(),
        occurred_at=datetime.now(UTC),
        allocation_id=request.allocation_id,
        workload=request.workload,
        pool=request.pool,
        node=request.node,
        shares=tuple(
            GpuShare(gpu_uuid=share.gpu_uuid, tflops_milli=share.tflops_milli, vram_bytes=share.vram_bytes)
            for share in request.shares
        ),
        qos=request.qos,
        isolation=request.isolation,
    )
    return event.model_dump(mode="json")


async def drive(
    mode: str,
    items: Sequence[Item],
    one: Callable[[Item], Awaitable[bool]],
    many: Callable[[Sequence[Item]], Awaitable[int]],
    *,
    concurrency: int,
    batch: int,
) -> tuple[int, float]:
    """Run `items` through `one` (one at a time, or `concurrency` callers) or `many` (in batches);
    returns how many succeeded and the seconds taken."""
    done = 0
    started = time.perf_counter()
    if mode == "one_at_a_time":
        for item in items:
            done += await one(item)
    elif mode == "concurrent":
        queue = iter(items)

        async def caller() -> int:
            succeeded = 0
            for item in queue:
                succeeded += await one(item)
            return succeeded

        done = sum(await asyncio.gather(*(caller() for _ in range(concurrency))))
    else:
        for start in range(0, len(items), batch):
            done += await many(items[start : start + batch])
    return done, time.perf_counter() - started


def _baseline_table(name: str) -> Table:
    return Table(
        name,
        MetaData(),
        Column("id", BigInteger, Identity(always=True), primary_key=True),
        Column("allocation_id", Uuid(), nullable=False),
        Column("payload", JSONB, nullable=False),
    )


def _inserter(
    engine: AsyncEngine, table: Table
) -> tuple[Callable[[dict[str, Any]], Awaitable[bool]], Callable[[Sequence[dict[str, Any]]], Awaitable[int]]]:
    async def one(row: dict[str, Any]) -> bool:
        async with engine.begin() as connection:
            returned = (await connection.execute(insert(table).values(row).returning(table.c.id))).all()
        return len(returned) == 1

    async def many(rows: Sequence[dict[str, Any]]) -> int:
        async with engine.begin() as connection:
            returned = (await connection.execute(insert(table).returning(table.c.id), list(rows))).all()
        return len(returned)

    return one, many


def _reserver(
    ledger: SqlLedger,
) -> tuple[
    Callable[[ReservationRequest], Awaitable[bool]], Callable[[Sequence[ReservationRequest]], Awaitable[int]]
]:
    async def one(request: ReservationRequest) -> bool:
        result = await ledger.reserve(request)
        return isinstance(result, Reserved) and not result.replayed

    async def many(requests: Sequence[ReservationRequest]) -> int:
        results = await ledger.reserve_many(requests)
        return sum(isinstance(result, Reserved) and not result.replayed for result in results)

    return one, many


async def _count(engine: AsyncEngine, pool: str, baseline: Table) -> tuple[dict[str, int], str]:
    allocation, outbox = tables.allocation.c, tables.outbox.c
    async with engine.connect() as connection:
        allocations = await connection.scalar(
            select(func.count(allocation.allocation_id.distinct())).where(allocation.pool_name == pool)
        )
        events = await connection.scalar(
            select(func.count()).select_from(tables.outbox).where(outbox.payload["pool"].astext == pool)
        )
        inserted = await connection.scalar(select(func.count()).select_from(baseline))
        fsync = await connection.scalar(text("SHOW fsync"))
    return {
        "allocations": int(allocations or 0),
        "outbox_events": int(events or 0),
        "baseline_rows": int(inserted or 0),
    }, str(fsync)


async def measure_ledger(
    database_url: str,
    *,
    reservations: int = DEFAULT_RESERVATIONS,
    concurrency: int = DEFAULT_CONCURRENCY,
    batch: int = DEFAULT_BATCH,
) -> dict[str, Any]:
    """Reservations per second in each of `MODES`, each with its bare-INSERT baseline and the ratio.

    `database_url` must be a migrated ledger; the run adds its own pool (`bench-<random>`), nodes, GPUs
    and allocations to it, and a scratch table it drops again. Raises `LedgerBenchmarkError` when a
    reservation is refused or a row is missing.
    """
    _check(reservations, concurrency, batch)
    pool = f"bench-{uuid4().hex[:8]}"
    total = reservations * len(MODES)
    ledger = SqlLedger.create(database_url, pool_size=POOL_SIZE)
    baseline = _baseline_table(f"bench_insert_{pool.replace('-', '_')}")
    try:
        gpus = await _register_gpus(ledger, pool, -(-total // SHARES_PER_GPU))
        async with ledger.engine.begin() as connection:
            await connection.run_sync(baseline.metadata.create_all)
        reserve_one, reserve_many = _reserver(ledger)
        insert_one, insert_many = _inserter(ledger.engine, baseline)
        modes: dict[str, Any] = {}
        for position, mode in enumerate(MODES):
            requests = _requests(pool, gpus, position * reservations, reservations)
            rows = [{"allocation_id": r.allocation_id, "payload": _event_payload(r)} for r in requests]
            shape = {"concurrency": concurrency, "batch": batch}
            inserted, insert_s = await drive(mode, rows, insert_one, insert_many, **shape)
            reserved, reserve_s = await drive(mode, requests, reserve_one, reserve_many, **shape)
            if reserved != reservations or inserted != reservations:
                raise LedgerBenchmarkError(
                    f"{mode}: {reserved} of {reservations} reservations and {inserted} baseline rows made"
                )
            per_second = reservations / reserve_s
            baseline_per_second = reservations / insert_s
            modes[mode] = {
                "reservations": reserved,
                "seconds": round(reserve_s, 3),
                "reservations_per_second": round(per_second, 1),
                "baseline_inserts_per_second": round(baseline_per_second, 1),
                "ratio": round(per_second / baseline_per_second, 3),
            }
        counted, fsync = await _count(ledger.engine, pool, baseline)
        async with ledger.engine.begin() as connection:
            await connection.run_sync(baseline.metadata.drop_all)
    finally:
        await ledger.close()
    if (
        counted["allocations"] != total
        or counted["outbox_events"] != total
        or counted["baseline_rows"] != total
    ):
        raise LedgerBenchmarkError(
            f"expected {total} allocations, outbox events and baseline rows; found {counted}"
        )
    return {
        "benchmark": "ledger-reservations",
        "reservations_per_mode": reservations,
        "concurrency": concurrency,
        "batch": batch,
        "pool_size": POOL_SIZE,
        "postgres_fsync": fsync,
        "share": {"tflops_milli": SHARE_TFLOPS_MILLI, "vram_bytes": SHARE_VRAM_BYTES},
        "gpus": len(gpus),
        "modes": modes,
        "rows": counted,
        "baseline": "bare INSERT ... RETURNING of the event payload, same connection pool and shape",
    }


def run_ledger_benchmark(
    reservations: int = DEFAULT_RESERVATIONS,
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    batch: int = DEFAULT_BATCH,
    database_url: str | None = None,
) -> dict[str, Any]:
    """`measure_ledger` on a scratch database of the server at `database_url` (embedded when None)."""
    _check(reservations, concurrency, batch)
    with postgres_server(database_url) as server_url, scratch_database(server_url, "bench_ledger") as url:
        return asyncio.run(
            measure_ledger(url, reservations=reservations, concurrency=concurrency, batch=batch)
        )

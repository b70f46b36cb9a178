"""The scheduler benchmark behind `tfctl bench scheduler` and `make bench`.

Runs the scheduler's placement path for real: a fresh, migrated Postgres ledger (embedded when no URL
is given), real NATS JetStream, the `Scheduler` engine and the outbox relay, over simulated nodes
registered straight into the ledger. A placement's latency runs from its submission until its
`tf.evt.allocation.created` event arrives on the bus (so the allocation is committed and announced).
A baseline measured in the same run (sequential raw `SqlLedger.reserve` calls) shows what the
database alone allows on this machine. This module only measures; it decides nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import psycopg
from nats.aio.msg import Msg
from sqlalchemy import insert
from sqlalchemy.engine import make_url
from tfcommon import subjects
from tfcommon.bus import NatsEventBus
from tfcommon.events import GpuRequest, WorkloadRef
from tfcommon.infra import EmbeddedNats, EmbeddedPostgres
from tfcommon.ledger import tables
from tfcommon.ledger.migrate import upgrade_head
from tfcommon.ledger.outbox import OutboxRelay
from tfcommon.ledger.records import ReservationRequest, ShareRequest
from tfcommon.ledger.sql import SqlLedger
from tfcommon.runtime import freeze_startup_heap

from tfscheduler.engine import Scheduler
from tfscheduler.submission import Submission

GIB = 1024**3
GPU_TFLOPS_MILLI = 100_000
GPU_VRAM_BYTES = 80 * GIB
POD_TFLOPS_MILLI = 2_000
POD_VRAM_BYTES = 2 * GIB
BASELINE_RESERVATIONS = 500
BATCH_LIMIT = 1000
SIMULATED_NODES_SILENT_FOR = timedelta(hours=1)


class BenchmarkError(ValueError):
    """A benchmark parameter is out of range; the message names it and the fix."""


@dataclass(frozen=True)
class _Run:
    placed: int
    seconds: float
    latencies_ms: list[float]
    committed_ms: list[float]


def _percentile(values: list[float], share: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def _summary(run: _Run) -> dict[str, Any]:
    return {
        "placed": run.placed,
        "seconds": round(run.seconds, 3),
        "placements_per_second": round(run.placed / run.seconds, 1) if run.seconds else 0.0,
        "p50_ms": round(_percentile(run.latencies_ms, 0.50), 2),
        "p99_ms": round(_percentile(run.latencies_ms, 0.99), 2),
        "mean_ms": round(statistics.fmean(run.latencies_ms), 2) if run.latencies_ms else 0.0,
        "committed_p50_ms": round(_percentile(run.committed_ms, 0.50), 2),
        "committed_p99_ms": round(_percentile(run.committed_ms, 0.99), 2),
    }


@contextlib.contextmanager
def _servers(database_url: str | None, nats_url: str | None) -> Iterator[tuple[str, str]]:
    root = Path(tempfile.mkdtemp(prefix="tf-bench-scheduler-"))
    started: list[EmbeddedNats | EmbeddedPostgres] = []
    try:
        if nats_url is None:
            nats = EmbeddedNats(store_dir=root / "nats")
            started.append(nats)
            nats_url = nats.start()
        if database_url is None:
            postgres = EmbeddedPostgres(data_dir=root / "pg")
            started.append(postgres)
            database_url = postgres.start()
        yield database_url, nats_url
    finally:
        for server in reversed(started):
            server.stop()
        shutil.rmtree(root, ignore_errors=True)


def _conninfo(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@contextlib.contextmanager
def _scratch_database(server_url: str) -> Iterator[str]:
    name = f"bench_scheduler_{uuid4().hex[:10]}"
    with psycopg.connect(_conninfo(server_url), autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    try:
        upgrade_head(url)
        yield url
    finally:
        with psycopg.connect(_conninfo(server_url), autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def register_simulated_nodes(ledger: SqlLedger, nodes: int, gpus_per_node: int, prefix: str) -> None:
    """Insert `nodes` ready nodes of `gpus_per_node` H100-sized GPUs into the `default` pool in bulk."""
    now = datetime.now(UTC)
    node_rows = [
        {"name": f"{prefix}-node-{n}", "pool_name": "default", "last_heartbeat_at": now} for n in range(nodes)
    ]
    gpu_rows = [
        {
            "uuid": f"{prefix}-gpu-{n}-{index}",
            "node_name": f"{prefix}-node-{n}",
            "index": index,
            "model": "H100",
            "vendor": "NVIDIA",
            "capacity_tflops_milli": GPU_TFLOPS_MILLI,
            "capacity_vram_bytes": GPU_VRAM_BYTES,
        }
        for n in range(nodes)
        for index in range(gpus_per_node)
    ]
    async with ledger.engine.begin() as connection:
        await connection.execute(insert(tables.pool).values(name="default"))
        for start in range(0, len(node_rows), BATCH_LIMIT):
            await connection.execute(insert(tables.node), node_rows[start : start + BATCH_LIMIT])
        for start in range(0, len(gpu_rows), BATCH_LIMIT):
            await connection.execute(insert(tables.gpu), gpu_rows[start : start + BATCH_LIMIT])


def benchmark_submission(name: str) -> Submission:
    """One benchmark pod: 2 TFLOPS and 2 GiB on one GPU, so 50 fit on a GPU by TFLOPS."""
    return Submission(
        workload=WorkloadRef(namespace="bench", name=name, uid=str(uuid4())),
        request=GpuRequest(
            pool="default",
            tflops_request_milli=POD_TFLOPS_MILLI,
            tflops_limit_milli=POD_TFLOPS_MILLI,
            vram_request_bytes=POD_VRAM_BYTES,
            vram_limit_bytes=POD_VRAM_BYTES,
        ),
    )


async def _baseline_reserve_rate(
    ledger: SqlLedger, count: int, prefix: str, gpus_per_node: int
) -> dict[str, Any]:
    started = time.perf_counter()
    for n in range(count):
        await ledger.reserve(
            ReservationRequest(
                allocation_id=uuid4(),
                workload=WorkloadRef(namespace="baseline", name=f"raw-{n}"),
                pool="default",
                node=f"{prefix}-node-0",
                shares=(
                    ShareRequest(
                        gpu_uuid=f"{prefix}-gpu-0-{n % gpus_per_node}", tflops_milli=1, vram_bytes=1
                    ),
                ),
            )
        )
    seconds = time.perf_counter() - started
    return {"reservations": count, "reserves_per_second": round(count / seconds, 1)}


@contextlib.asynccontextmanager
async def _announced(bus: NatsEventBus) -> AsyncIterator[dict[UUID, float]]:
    arrivals: dict[UUID, float] = {}

    async def keep(message: Msg) -> None:
        arrivals[UUID(json.loads(message.data)["allocation_id"])] = time.perf_counter()

    subscription = await bus.nc.subscribe(subjects.ALLOCATION_CREATED, cb=keep)
    try:
        yield arrivals
    finally:
        await subscription.unsubscribe()


async def _wait_for(arrivals: dict[UUID, float], wanted: set[UUID], timeout_s: float) -> None:
    deadline = time.perf_counter() + timeout_s
    while not wanted <= arrivals.keys():
        if time.perf_counter() > deadline:
            missing = len(wanted - arrivals.keys())
            raise TimeoutError(f"{missing} allocation events did not arrive within {timeout_s:.0f} s")
        await asyncio.sleep(0.005)


async def _burst(scheduler: Scheduler, bus: NatsEventBus, pods: int, concurrency: int) -> _Run:
    submissions = [benchmark_submission(f"burst-{n}") for n in range(pods)]
    submitted_at: dict[UUID, float] = {}
    committed_ms: list[float] = []
    gate = asyncio.Semaphore(concurrency)

    async def one(submission: Submission) -> UUID | None:
        async with gate:
            began = time.perf_counter()
            status = await scheduler.submit(submission)
            committed_ms.append((time.perf_counter() - began) * 1000)
            submitted_at[status.id] = began
            return status.id if status.state == "placed" else None

    async with _announced(bus) as arrivals:
        started = time.perf_counter()
        placed = {found for found in await asyncio.gather(*(one(s) for s in submissions)) if found}
        await _wait_for(arrivals, placed, timeout_s=60 + pods / 50)
        seconds = max(arrivals[i] for i in placed) - started if placed else 0.0
        latencies = [(arrivals[i] - submitted_at[i]) * 1000 for i in placed]
    return _Run(placed=len(placed), seconds=seconds, latencies_ms=latencies, committed_ms=committed_ms)


async def _offered(scheduler: Scheduler, bus: NatsEventBus, pods: int, rate: float) -> _Run:
    submitted_at: dict[UUID, float] = {}
    committed_ms: list[float] = []
    placed: set[UUID] = set()

    async def one(submission: Submission, began: float) -> None:
        status = await scheduler.submit(submission)
        committed_ms.append((time.perf_counter() - began) * 1000)
        submitted_at[status.id] = began
        if status.state == "placed":
            placed.add(status.id)

    async with _announced(bus) as arrivals:
        started = time.perf_counter()
        tasks = []
        for n in range(pods):
            due = started + n / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(benchmark_submission(f"offered-{n}"), time.perf_counter())))
        await asyncio.gather(*tasks)
        await _wait_for(arrivals, placed, timeout_s=60 + pods / 50)
        seconds = time.perf_counter() - started
        latencies = [(arrivals[i] - submitted_at[i]) * 1000 for i in placed]
    return _Run(placed=len(placed), seconds=seconds, latencies_ms=latencies, committed_ms=committed_ms)


async def _measure(
    database_url: str,
    nats_url: str,
    *,
    nodes: int,
    gpus_per_node: int,
    pods: int,
    concurrency: int,
    offered_rate: float,
    offered_pods: int,
) -> dict[str, Any]:
    prefix = uuid4().hex[:6]
    ledger = SqlLedger.create(database_url, pool_size=10)
    bus = await NatsEventBus.connect(nats_url, service="scheduler-bench")
    stop = asyncio.Event()
    try:
        await subjects.provision(bus.js)
        await register_simulated_nodes(ledger, nodes, gpus_per_node, prefix)
        baseline = await _baseline_reserve_rate(ledger, BASELINE_RESERVATIONS, prefix, gpus_per_node)
        scheduler = Scheduler(
            ledger, bus, heartbeat_timeout=SIMULATED_NODES_SILENT_FOR, name="scheduler-bench"
        )
        await scheduler.start()
        freeze_startup_heap()  # as the service does once composed
        relay = OutboxRelay(ledger, bus, batch_size=500)
        relay_task = asyncio.create_task(relay.run(stop))
        try:
            burst = await _burst(scheduler, bus, pods, concurrency)
            offered = await _offered(scheduler, bus, offered_pods, offered_rate) if offered_pods else None
        finally:
            stop.set()
            await relay_task
    finally:
        await bus.close()
        await ledger.close()
    result: dict[str, Any] = {
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "pods": pods,
        "concurrency": concurrency,
        **_summary(burst),
        "baseline_raw_reserve": baseline,
    }
    if offered is not None:
        result["offered"] = {"rate_per_second": offered_rate, **_summary(offered)}
    return result


def run_scheduler_benchmark(
    nodes: int = 1000,
    gpus_per_node: int = 8,
    pods: int = 20_000,
    *,
    concurrency: int = 64,
    offered_rate: float = 200.0,
    offered_pods: int = 2_000,
    database_url: str | None = None,
    nats_url: str | None = None,
) -> dict[str, Any]:
    """Place `pods` submitted `concurrency` at a time, then `offered_pods` offered at `offered_rate`/s.

    Servers: `database_url` (a Postgres server; a scratch database is created and dropped on it) and
    `nats_url`, or embedded ones when None. Returns `placements_per_second`, `p50_ms`, `p99_ms` (until
    the event arrived; `committed_p50_ms` / `committed_p99_ms`: until `submit()` returned with the
    allocation committed; `mean_ms`, `placed`, `seconds`) for the burst, the same under `offered`, and
    `baseline_raw_reserve.reserves_per_second` (sequential raw ledger reservations, same machine).
    """
    if nodes < 1 or gpus_per_node < 1 or pods < 1:
        raise BenchmarkError("--nodes, --gpus-per-node and --pods: each must be at least 1")
    if concurrency < 1:
        raise BenchmarkError("--concurrency: must be at least 1")
    if offered_pods and offered_rate <= 0:
        raise BenchmarkError("--offered-rate: must be above 0 (or pass --offered-pods 0 to skip it)")
    capacity = nodes * gpus_per_node * (GPU_TFLOPS_MILLI // POD_TFLOPS_MILLI)
    if pods + offered_pods > capacity:
        raise BenchmarkError(
            f"--pods: {pods} + {offered_pods} offered exceed the {capacity} pods the cluster holds; "
            "add --nodes or lower --pods"
        )
    with _servers(database_url, nats_url) as (server_url, bus_url), _scratch_database(server_url) as url:
        return asyncio.run(
            _measure(
                url,
                bus_url,
                nodes=nodes,
                gpus_per_node=gpus_per_node,
                pods=pods,
                concurrency=concurrency,
                offered_rate=offered_rate,
                offered_pods=offered_pods,
            )
        )

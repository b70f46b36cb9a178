"""The scheduler benchmark behind `tfctl bench scheduler` and `make bench`.

Each run places pods for real on a fresh, migrated Postgres ledger and real NATS JetStream, over
simulated nodes registered straight into the ledger (8 GPUs of 100 TFLOPS / 80 GiB by default), and
submits them one of three ways (`via`):

- `in-process`: `Scheduler.submit` in this process, with the outbox relay on the same event loop as
  the load (the shortcut path: no HTTP, no bus on the way in);
- `http`: `POST /api/v1/workloads` to the scheduler service itself (`python -m tfscheduler`, its own
  process, with its consumers, relay and timers), over keep-alive connections;
- `nats`: `WorkloadSubmitted` published to JetStream, taken by the service's `schedule-workload`
  consumer (the inbound path of watched pods and `tfctl run`).

Pods have one shape (2 TFLOPS / 2 GiB on one GPU) or, with `mixed_shapes`, the GPU shapes of the
openb trace (GPU count and share of each GPU, drawn with a fixed seed; each shape fits an empty node).
A placement's latency runs until its `tf.evt.allocation.created` arrives on the bus: the allocation is
committed and announced. A burst submits `pods` with `concurrency` in flight; the offered load then
sends `offered_pods` at `offered_rate` a second, open loop, and counts each latency from the pod's
intended send time, so a sender that falls behind adds its delay (no coordinated omission).

The baseline is measured in the same run, after the scheduler stopped: the ledger alone making the
burst's reservations again (`SqlLedger.reserve_many`, the same shares on a mirror of the nodes used)
in batches of the sizes the scheduler's own transactions had, one batch after another as the
scheduler writes them. The in-process run also records where the tail comes from: each batch's
time, garbage-collection pauses, the event loop's lag and the relay's passes. This module only
measures; it decides nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal
from uuid import UUID, uuid4

from nats.aio.msg import Msg
from sqlalchemy import insert, text
from tfcommon import subjects
from tfcommon.bus import NatsEventBus
from tfcommon.events import GpuRequest, WorkloadRef, WorkloadSubmitted
from tfcommon.ledger import tables
from tfcommon.ledger.outbox import OutboxRelay
from tfcommon.ledger.records import ReservationRequest, Reserved, ShareRequest
from tfcommon.ledger.sql import SqlLedger
from tfcommon.placement import ClusterView, PlacementRequest
from tfcommon.runtime import freeze_full_collection_survivors, freeze_startup_heap

from tfscheduler.core.view import allocation_id_for, build_snapshot
from tfscheduler.engine import Scheduler
from tfscheduler.policies import LearnedPolicies
from tfscheduler.submission import Submission

GIB = 1024**3
GPU_TFLOPS_MILLI = 100_000
GPU_VRAM_BYTES = 80 * GIB
POD_TFLOPS_MILLI = 2_000
POD_VRAM_BYTES = 2 * GIB
BATCH_LIMIT = 1000
FILL_AT_MOST = 0.8
"""Most of the cluster's GPU capacity the pods of a run may ask for (fragmentation leaves the rest)."""
SIMULATED_NODES_SILENT_FOR = timedelta(hours=1)
SERVICE_START_TIMEOUT_S = 180.0
HTTP_CONNECTIONS_OFFERED = 32
LOOP_TICK_S = 0.005
SETTLED_AFTER_S = 5.0
SHAPE_SEED = 42

Via = Literal["in-process", "http", "nats"]
VIAS: tuple[Via, ...] = ("in-process", "http", "nats")
Progress = Callable[[str], None]
ScratchDatabase = Callable[[], AbstractContextManager[str]]
"""A fresh, migrated database for one run: the context manager yields its URL and drops it afterwards."""


class BenchmarkError(ValueError):
    """A benchmark parameter is out of range, or a run lost work; the message names it and the fix."""


@dataclass(frozen=True)
class SchedulerRun:
    """One run: how pods are submitted, on how many simulated nodes, and with which shapes."""

    via: Via
    nodes: int
    mixed_shapes: bool

    def label(self) -> str:
        shapes = "openb shapes" if self.mixed_shapes else "one shape"
        return f"via {self.via}, {self.nodes:,} nodes, {shapes}"


@dataclass(frozen=True)
class _Load:
    """What one run submits: the burst (`concurrency` in flight), then `offered` at `offered_rate`/s."""

    burst: Sequence[Submission]
    offered: Sequence[Submission]
    concurrency: int
    offered_rate: float


@dataclass
class _Outcome:
    """What happened to the submissions of one phase (burst or offered)."""

    started: float
    due: dict[UUID, float] = field(default_factory=dict)
    answered_ms: list[float] = field(default_factory=list)
    pending: set[UUID] = field(default_factory=set)


def _percentile(values: Sequence[float], share: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def _latency_summary(latencies_ms: Sequence[float]) -> dict[str, float]:
    return {
        "p50_ms": round(_percentile(latencies_ms, 0.50), 2),
        "p90_ms": round(_percentile(latencies_ms, 0.90), 2),
        "p99_ms": round(_percentile(latencies_ms, 0.99), 2),
        "max_ms": round(max(latencies_ms, default=0.0), 2),
        "mean_ms": round(statistics.fmean(latencies_ms), 2) if latencies_ms else 0.0,
    }


async def register_simulated_nodes(
    ledger: SqlLedger, nodes: int, gpus_per_node: int, prefix: str, *, pool: str = "default"
) -> None:
    """Insert `nodes` ready nodes of `gpus_per_node` H100-sized GPUs into a new `pool`, in bulk."""
    now = datetime.now(UTC)
    node_rows = [
        {"name": f"{prefix}-node-{n}", "pool_name": pool, "last_heartbeat_at": now} for n in range(nodes)
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
        await connection.execute(insert(tables.pool).values(name=pool))
        for start in range(0, len(node_rows), BATCH_LIMIT):
            await connection.execute(insert(tables.node), node_rows[start : start + BATCH_LIMIT])
        for start in range(0, len(gpu_rows), BATCH_LIMIT):
            await connection.execute(insert(tables.gpu), gpu_rows[start : start + BATCH_LIMIT])


def benchmark_submission(name: str) -> Submission:
    """One benchmark pod of the single shape: 2 TFLOPS and 2 GiB on one GPU (50 fit on a GPU)."""
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


def shaped_submission(name: str, shape: PlacementRequest) -> Submission:
    """A pod of a trace shape: its GPU count, and its share of each GPU's TFLOPS and VRAM."""
    share = shape.gpu_share or 1000
    tflops, vram = share * GPU_TFLOPS_MILLI // 1000, share * GPU_VRAM_BYTES // 1000
    return Submission(
        workload=WorkloadRef(namespace="bench", name=name, uid=str(uuid4())),
        request=GpuRequest(
            pool="default",
            gpu_count=shape.gpu_count,
            tflops_request_milli=tflops,
            tflops_limit_milli=tflops,
            vram_request_bytes=vram,
            vram_limit_bytes=vram,
        ),
    )


def _submissions(
    count: int, prefix: str, shapes: Sequence[PlacementRequest] | None, rng: random.Random
) -> list[Submission]:
    if shapes is None:
        return [benchmark_submission(f"{prefix}-{n}") for n in range(count)]
    return [shaped_submission(f"{prefix}-{n}", rng.choice(shapes)) for n in range(count)]


def _gpu_demand_milli(submission: Submission) -> int:
    request = submission.request
    return request.gpu_count * request.tflops_request_milli * 1000 // GPU_TFLOPS_MILLI


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
            raise BenchmarkError(f"{missing} allocation events did not arrive within {timeout_s:.0f} s")
        await asyncio.sleep(0.005)


Submit = Callable[[Submission], Awaitable[tuple[UUID, str]]]
"""Submits one pod the run's way; its allocation id and state (`placed`, `pending`, or `sent`)."""


async def _one(submit: Submit, submission: Submission, due: float, outcome: _Outcome) -> None:
    allocation_id, state = await submit(submission)
    outcome.answered_ms.append((time.perf_counter() - due) * 1000)
    outcome.due[allocation_id] = due
    if state == "pending":
        outcome.pending.add(allocation_id)


async def _burst(submit: Submit, submissions: Sequence[Submission], concurrency: int) -> _Outcome:
    outcome = _Outcome(started=time.perf_counter())
    gate = asyncio.Semaphore(concurrency)

    async def gated(submission: Submission) -> None:
        async with gate:
            await _one(submit, submission, time.perf_counter(), outcome)

    await asyncio.gather(*(gated(submission) for submission in submissions))
    return outcome


async def _offered(submit: Submit, submissions: Sequence[Submission], rate: float) -> _Outcome:
    """Each submission sent at its intended time `started + n / rate` (or as soon after as the sender
    can), its latency counted from that intended time."""
    outcome = _Outcome(started=time.perf_counter())
    tasks = []
    for n, submission in enumerate(submissions):
        due = outcome.started + n / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(_one(submit, submission, due, outcome)))
    await asyncio.gather(*tasks)
    return outcome


def _settled(outcome: _Outcome, arrivals: dict[UUID, float], finished: float) -> dict[str, Any]:
    placed = [allocation_id for allocation_id in outcome.due if allocation_id in arrivals]
    latencies = [(arrivals[i] - outcome.due[i]) * 1000 for i in placed]
    last = max((arrivals[i] for i in placed), default=finished)
    seconds = last - outcome.started
    return {
        "submitted": len(outcome.due),
        "placed": len(placed),
        "pending": len(outcome.due) - len(placed),
        "seconds": round(seconds, 3),
        "placements_per_second": round(len(placed) / seconds, 1) if seconds > 0 else 0.0,
        **_latency_summary(latencies),
        "answered_p50_ms": round(_percentile(outcome.answered_ms, 0.50), 2),
        "answered_p99_ms": round(_percentile(outcome.answered_ms, 0.99), 2),
    }


class _HttpClient:
    """Keep-alive HTTP/1.1 connections to the scheduler API, a raw loop so the load stays light."""

    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.token = token
        self._idle: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
        self._all: list[asyncio.StreamWriter] = []

    async def open(self, connections: int) -> None:
        for _ in range(connections):
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            self._all.append(writer)
            self._idle.put_nowait((reader, writer))

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        reader, writer = await self._idle.get()
        try:
            head = (
                f"{method} {path} HTTP/1.1\r\nhost: 127.0.0.1:{self.port}\r\n"
                f"authorization: Bearer {self.token}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\n\r\n"
            )
            writer.write(head.encode() + body)
            status_line, *header_lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            length = next(
                int(line.split(":", 1)[1])
                for line in header_lines
                if line.lower().startswith("content-length:")
            )
            return int(status_line.split()[1]), await reader.readexactly(length)
        finally:
            self._idle.put_nowait((reader, writer))

    async def close(self) -> None:
        for writer in self._all:
            writer.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.asynccontextmanager
async def scheduler_service(
    database_url: str, nats_url: str, environment: Mapping[str, str] | None = None
) -> AsyncIterator[tuple[int, str]]:
    """`python -m tfscheduler` on a free port over the run's ledger and NATS (plus `environment`, e.g.
    Kubernetes mode's settings); yields its port and API token once it answers `/readyz`, and stops it
    afterwards."""
    port, token = _free_port(), uuid4().hex
    inherited = {name: value for name, value in os.environ.items() if not name.startswith("TF_")}
    environment = {**inherited, **(environment or {})}
    environment.update(
        TF_PORT=str(port),
        TF_BIND_HOST="127.0.0.1",
        TF_DATABASE_URL=database_url,
        TF_NATS_URL=nats_url,
        TF_API_TOKEN=token,
        TF_LOG_LEVEL="WARNING",
        TF_SCHEDULER_HEARTBEAT_TIMEOUT_S=str(SIMULATED_NODES_SILENT_FOR.total_seconds()),
    )
    with tempfile.TemporaryDirectory(prefix="tf-bench-scheduler-") as folder:
        log = Path(folder) / "scheduler.log"
        with log.open("ab") as output:
            process = subprocess.Popen(  # noqa: ASYNC220 - starting a process does not block
                [sys.executable, "-m", "tfscheduler"],
                env=environment,
                cwd=folder,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            await _until_ready(process, port, token, log)
            yield port, token
            if process.poll() is not None:
                raise BenchmarkError(
                    f"the scheduler service exited during the run (code {process.returncode}):\n"
                    f"{_tail_of(log)}"
                )
        finally:
            _stop(process)


async def _until_ready(process: subprocess.Popen[bytes], port: int, token: str, log: Path) -> None:
    deadline = time.monotonic() + SERVICE_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BenchmarkError(
                f"the scheduler service exited with code {process.returncode}:\n{_tail_of(log)}"
            )
        client = _HttpClient(port, token)
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, ValueError, StopIteration):
            await client.open(1)
            status, _body = await client.request("GET", "/readyz")
            await client.close()
            if status == 200:
                return
        await asyncio.sleep(0.2)
    raise BenchmarkError(
        f"the scheduler service did not answer /readyz within {SERVICE_START_TIMEOUT_S:.0f} s"
    )


def _tail_of(log: Path) -> str:
    return log.read_text(errors="replace")[-2000:]


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)


def _http_submit(client: _HttpClient) -> Submit:
    async def submit(submission: Submission) -> tuple[UUID, str]:
        status, body = await client.request(
            "POST", "/api/v1/workloads", submission.model_dump_json(exclude_defaults=True).encode()
        )
        if status not in (200, 201, 202):
            raise BenchmarkError(f"POST /api/v1/workloads answered {status}: {body[:300]!r}")
        answer = json.loads(body)
        return UUID(answer["id"]), str(answer["state"])

    return submit


def _nats_submit(bus: NatsEventBus) -> Submit:
    async def submit(submission: Submission) -> tuple[UUID, str]:
        await bus.publish(
            WorkloadSubmitted(
                event_id=uuid4(),
                occurred_at=datetime.now(UTC),
                workload=submission.workload,
                request=submission.request,
                source="local",
            )
        )
        return allocation_id_for(submission.workload), "sent"

    return submit


class _TimedPolicies(LearnedPolicies):
    """The scheduler's policies, each start of new ones timed (start, seconds) for the tail analysis."""

    relearnings: list[tuple[float, float]]

    async def start_learned(self) -> None:
        began = time.perf_counter()
        try:
            await super().start_learned()
        finally:
            self.relearnings.append((began, time.perf_counter() - began))


class _TimedScheduler(Scheduler):
    """The engine, each submission batch timed (start, seconds, size) and each start of new policies
    (start, seconds) for the tail analysis."""

    batches: list[tuple[float, float, int]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.policies = self.timed_policies = _TimedPolicies(self.policies.mode_of, name=self.name)
        self.timed_policies.relearnings = []

    @property
    def relearnings(self) -> list[tuple[float, float]]:
        return self.timed_policies.relearnings

    async def _submit_batch(self, batch: list[Any]) -> None:
        began = time.perf_counter()
        try:
            await super()._submit_batch(batch)
        finally:
            self.batches.append((began, time.perf_counter() - began, len(batch)))


class _TimedRelay(OutboxRelay):
    """The outbox relay, each pass timed (start, seconds) for the tail analysis."""

    passes: list[tuple[float, float]]

    async def _publish_pass(self, on_acknowledged: Callable[[int], None] | None) -> int:
        began = time.perf_counter()
        try:
            return await super()._publish_pass(on_acknowledged)
        finally:
            self.passes.append((began, time.perf_counter() - began))


class _TailWitness:
    """Garbage-collection pauses and the event loop's lag while it watches."""

    def __init__(self) -> None:
        self.gc_pauses_ms: list[tuple[int, float]] = []
        self.loop_lag_ms: list[float] = []
        self._gc_started = 0.0
        self._ticker: asyncio.Task[None] | None = None

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self.gc_pauses_ms.append(
                (int(info["generation"]), (time.perf_counter() - self._gc_started) * 1000)
            )

    async def _tick(self) -> None:
        while True:
            planned = time.perf_counter() + LOOP_TICK_S
            await asyncio.sleep(LOOP_TICK_S)
            self.loop_lag_ms.append(max(0.0, (time.perf_counter() - planned) * 1000))

    def __enter__(self) -> _TailWitness:
        gc.callbacks.append(self._on_gc)
        self._ticker = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *_exc: object) -> None:
        gc.callbacks.remove(self._on_gc)
        if self._ticker is not None:
            self._ticker.cancel()

    def summary(self) -> dict[str, Any]:
        pauses = [ms for _generation, ms in self.gc_pauses_ms]
        return {
            "gc_collections": len(pauses),
            "gc_full_collections": sum(1 for generation, _ms in self.gc_pauses_ms if generation == 2),
            "gc_pause_max_ms": round(max(pauses, default=0.0), 2),
            "gc_pause_total_ms": round(sum(pauses), 1),
            "loop_lag_p99_ms": round(_percentile(self.loop_lag_ms, 0.99), 2),
            "loop_lag_max_ms": round(max(self.loop_lag_ms, default=0.0), 2),
        }


def _spans_summary(spans: Sequence[tuple[float, float]], since: float) -> dict[str, float]:
    seconds = [length * 1000 for began, length in spans if began >= since]
    return {
        "count": len(seconds),
        "p50_ms": round(_percentile(seconds, 0.5), 2),
        "p99_ms": round(_percentile(seconds, 0.99), 2),
        "max_ms": round(max(seconds, default=0.0), 2),
    }


async def _batch_sizes(ledger: SqlLedger, allocation_ids: Sequence[UUID]) -> list[list[UUID]]:
    """The burst's reservations grouped by the ledger transaction that wrote them, in commit order."""
    statement = text(
        "SELECT xmin::text AS transaction, array_agg(DISTINCT allocation_id) AS ids, min(id) AS first "
        "FROM allocation WHERE allocation_id = ANY(:ids) GROUP BY xmin::text ORDER BY first"
    )
    async with ledger.engine.connect() as connection:
        rows = (await connection.execute(statement, {"ids": list(allocation_ids)})).all()
    return [list(row.ids) for row in rows]


async def _baseline_reserve_many(
    ledger: SqlLedger, batches: Sequence[Sequence[UUID]], gpus_per_node: int
) -> dict[str, Any]:
    """The same reservations again, on a mirror of the nodes they used, with `reserve_many` in the
    scheduler's batch sizes, one batch after another; fails unless every one is reserved."""
    ids = [allocation_id for batch in batches for allocation_id in batch]
    shares_statement = text(
        "SELECT allocation_id, node_name, gpu_uuid, request_tflops_milli, request_vram_bytes "
        "FROM allocation WHERE allocation_id = ANY(:ids) ORDER BY allocation_id, share_index"
    )
    async with ledger.engine.connect() as connection:
        rows = (await connection.execute(shares_statement, {"ids": ids})).all()
    by_allocation: dict[UUID, list[Any]] = {}
    for row in rows:
        by_allocation.setdefault(row.allocation_id, []).append(row)
    used_nodes = sorted({row.node_name for row in rows})
    mirror = "mirror"
    await _register_mirror(ledger, used_nodes, gpus_per_node, mirror)
    requests = [
        [
            ReservationRequest(
                allocation_id=uuid4(),
                workload=WorkloadRef(namespace="baseline", name=str(allocation_id)),
                pool=mirror,
                node=f"{mirror}-{by_allocation[allocation_id][0].node_name}",
                shares=tuple(
                    ShareRequest(
                        gpu_uuid=f"{mirror}-{row.gpu_uuid}",
                        tflops_milli=row.request_tflops_milli,
                        vram_bytes=row.request_vram_bytes,
                    )
                    for row in by_allocation[allocation_id]
                ),
            )
            for allocation_id in batch
        ]
        for batch in batches
    ]
    started = time.perf_counter()
    results = [result for batch in requests for result in await ledger.reserve_many(batch, commit=True)]
    seconds = time.perf_counter() - started
    refused = [result for result in results if not isinstance(result, Reserved)]
    if refused:
        raise BenchmarkError(
            f"the baseline's reserve_many refused {len(refused)} of {len(results)}: {refused[0]}"
        )
    sizes = [len(batch) for batch in batches]
    return {
        "reservations": len(results),
        "reservations_per_second": round(len(results) / seconds, 1) if seconds > 0 else 0.0,
        "batches": len(sizes),
        "batch_size_mean": round(statistics.fmean(sizes), 1) if sizes else 0.0,
        "batch_size_max": max(sizes, default=0),
    }


async def _register_mirror(ledger: SqlLedger, nodes: Sequence[str], gpus_per_node: int, mirror: str) -> None:
    statement = text("SELECT uuid, node_name, index FROM gpu WHERE node_name = ANY(:nodes)")
    async with ledger.engine.connect() as connection:
        gpus = (await connection.execute(statement, {"nodes": list(nodes)})).all()
    now = datetime.now(UTC)
    async with ledger.engine.begin() as connection:
        await connection.execute(insert(tables.pool).values(name=mirror))
        node_rows = [
            {"name": f"{mirror}-{node}", "pool_name": mirror, "last_heartbeat_at": now} for node in nodes
        ]
        gpu_rows = [
            {
                "uuid": f"{mirror}-{gpu.uuid}",
                "node_name": f"{mirror}-{gpu.node_name}",
                "index": gpu.index,
                "model": "H100",
                "vendor": "NVIDIA",
                "capacity_tflops_milli": GPU_TFLOPS_MILLI,
                "capacity_vram_bytes": GPU_VRAM_BYTES,
            }
            for gpu in gpus
        ]
        for start in range(0, len(node_rows), BATCH_LIMIT):
            await connection.execute(insert(tables.node), node_rows[start : start + BATCH_LIMIT])
        for start in range(0, len(gpu_rows), BATCH_LIMIT):
            await connection.execute(insert(tables.gpu), gpu_rows[start : start + BATCH_LIMIT])


async def _measure(
    run: SchedulerRun,
    database_url: str,
    nats_url: str,
    *,
    gpus_per_node: int,
    pods: int,
    concurrency: int,
    offered_rate: float,
    offered_pods: int,
    shapes: Sequence[PlacementRequest],
) -> dict[str, Any]:
    rng = random.Random(SHAPE_SEED)
    fitting = [shape for shape in shapes if 1 <= shape.gpu_count <= gpus_per_node]
    if run.mixed_shapes and not fitting:
        raise BenchmarkError(f"mixed shapes: no shape of the trace fits a node of {gpus_per_node} GPUs")
    chosen = fitting if run.mixed_shapes else None
    burst_pods = _submissions(pods, f"burst-{uuid4().hex[:6]}", chosen, rng)
    offered = _submissions(offered_pods, f"offered-{uuid4().hex[:6]}", chosen, rng)
    load = _Load(burst_pods, offered, concurrency, offered_rate)
    demand = sum(_gpu_demand_milli(submission) for submission in [*burst_pods, *offered])
    capacity = run.nodes * gpus_per_node * 1000
    if demand > FILL_AT_MOST * capacity:
        raise BenchmarkError(
            f"{run.label()}: the pods ask for {demand / 1000:,.0f} GPUs of the {capacity / 1000:,.0f} the "
            f"nodes have (at most {FILL_AT_MOST:.0%}); add --nodes or lower --pods / --offered-pods"
        )
    ledger = SqlLedger.create(database_url, pool_size=10)
    bus = await NatsEventBus.connect(nats_url, service="scheduler-bench")
    try:
        await subjects.provision(bus.js)
        prefix = uuid4().hex[:6]
        await register_simulated_nodes(ledger, run.nodes, gpus_per_node, prefix)
        if run.via == "in-process":
            measured = await _in_process(ledger, bus, load)
        else:
            measured = await _through_the_service(run.via, database_url, nats_url, bus, load)
        burst_ids, burst_pending = measured.pop("burst_ids"), measured.pop("burst_pending")
        placed = [i for i in burst_ids if i not in burst_pending]
        batches = await _batch_sizes(ledger, placed)
        baseline = await _baseline_reserve_many(ledger, batches, gpus_per_node)
    finally:
        await bus.close()
        await ledger.close()
    burst = measured["burst"]
    return {
        "via": run.via,
        "nodes": run.nodes,
        "gpus_per_node": gpus_per_node,
        "mixed_shapes": run.mixed_shapes,
        "shapes": len(chosen) if chosen else 1,
        "concurrency": concurrency,
        **measured,
        "baseline_reserve_many": baseline,
        "ratio": round(burst["placements_per_second"] / baseline["reservations_per_second"], 3)
        if baseline["reservations_per_second"]
        else None,
    }


async def _in_process(ledger: SqlLedger, bus: NatsEventBus, load: _Load) -> dict[str, Any]:
    scheduler = _TimedScheduler(
        ledger, bus, heartbeat_timeout=SIMULATED_NODES_SILENT_FOR, name="scheduler-bench"
    )
    scheduler.batches = []
    await scheduler.start()
    freeze_startup_heap()  # as the service does once composed
    freeze_full_collection_survivors()
    relay = _TimedRelay(ledger, bus)
    relay.passes = []
    stop = asyncio.Event()
    relay_task = asyncio.create_task(relay.run(stop))

    async def submit(submission: Submission) -> tuple[UUID, str]:
        status = await scheduler.submit(submission)
        return status.id, status.state

    try:
        async with _announced(bus) as arrivals:
            result, burst = await _phases(submit, arrivals, load)
            if load.offered:
                since = result["offered_started_at"]
                result["tail"] = {
                    "batches": _spans_summary([(b, s) for b, s, _n in scheduler.batches], since),
                    "batch_size_max": max((n for b, _s, n in scheduler.batches if b >= since), default=0),
                    "relay_passes": _spans_summary(relay.passes, since),
                    "new_policies": _spans_summary(scheduler.relearnings, since),
                    **result.pop("witness"),
                }
            result.pop("offered_started_at", None)
        result["rebuild"] = await _rebuild_stalls(scheduler, ledger)
    finally:
        stop.set()
        await relay_task
    return {**result, "burst_ids": list(burst.due), "burst_pending": burst.pending}


REBUILD_ROUNDS = 3


async def _rebuild_stalls(scheduler: Scheduler, ledger: SqlLedger) -> dict[str, Any]:
    """The periodic rebuild of the view from the ledger (`Scheduler.start`, reading and building in
    worker threads), against the same rebuild read and built in the event loop (as the scheduler did
    before): each one's wall time and the longest stall of the event loop while it ran, medians of
    `REBUILD_ROUNDS` alternating rounds on the placements the run left."""

    async def in_the_loop() -> None:
        nodes, gpus = await ledger.list_nodes(), await ledger.list_gpus()
        allocations = await ledger.active_allocations()
        snapshot = build_snapshot(
            nodes, gpus, allocations, scheduler.clock(), heartbeat_timeout=SIMULATED_NODES_SILENT_FOR
        )
        ClusterView(snapshot.nodes.values())

    measured: dict[str, list[tuple[float, float]]] = {"threads": [], "in_loop": []}
    for _round in range(REBUILD_ROUNDS):
        for name, rebuild in (("threads", scheduler.start), ("in_loop", in_the_loop)):
            with _TailWitness() as witness:
                await asyncio.sleep(LOOP_TICK_S * 4)
                began = time.perf_counter()
                await rebuild()
                seconds = time.perf_counter() - began
            measured[name].append((seconds, max(witness.loop_lag_ms, default=0.0)))
    summary: dict[str, Any] = {"rounds": REBUILD_ROUNDS}
    for name, rounds in measured.items():
        summary[f"{name}_seconds"] = round(statistics.median(seconds for seconds, _ in rounds), 3)
        summary[f"{name}_loop_stall_max_ms"] = round(statistics.median(stall for _, stall in rounds), 1)
    return summary


async def _phases(
    submit: Submit, arrivals: dict[UUID, float], load: _Load, *, answered: bool = True
) -> tuple[dict[str, Any], _Outcome]:
    burst = await _burst(submit, load.burst, load.concurrency)
    await _settle(arrivals, burst, answered=answered)
    result: dict[str, Any] = {"burst": _settled(burst, arrivals, time.perf_counter())}
    if load.offered:
        with _TailWitness() as witness:
            result["offered_started_at"] = time.perf_counter()
            offered_outcome = await _offered(submit, load.offered, load.offered_rate)
            await _settle(arrivals, offered_outcome, answered=answered)
        result["offered"] = {
            "rate_per_second": load.offered_rate,
            **_settled(offered_outcome, arrivals, time.perf_counter()),
        }
        result["witness"] = witness.summary()
    return result, burst


async def _settle(arrivals: dict[UUID, float], outcome: _Outcome, *, answered: bool) -> None:
    """Wait for the event of every submission the scheduler placed. Those it answered `pending` never
    come; a submission sent over the bus has no answer, so it counts as pending when no event of the
    phase arrived for `SETTLED_AFTER_S`. An answered placement whose event is missing fails the run."""
    expected = {i for i in outcome.due if i not in outcome.pending}
    if answered:
        await _wait_for(arrivals, expected, timeout_s=30 + len(expected) / 50)
        return
    deadline, seen, quiet_since = time.perf_counter() + 60 + len(expected) / 50, -1, time.perf_counter()
    while not expected <= arrivals.keys() and time.perf_counter() < deadline:
        arrived = len(expected & arrivals.keys())
        if arrived != seen:
            seen, quiet_since = arrived, time.perf_counter()
        elif time.perf_counter() - quiet_since > SETTLED_AFTER_S:
            break
        await asyncio.sleep(0.01)
    outcome.pending |= expected - arrivals.keys()


async def _through_the_service(
    via: Via, database_url: str, nats_url: str, bus: NatsEventBus, load: _Load
) -> dict[str, Any]:
    async with scheduler_service(database_url, nats_url) as (port, token):
        client = _HttpClient(port, token)
        if via == "http":
            await client.open(max(load.concurrency, HTTP_CONNECTIONS_OFFERED))
        submit = _http_submit(client) if via == "http" else _nats_submit(bus)
        try:
            async with _announced(bus) as arrivals:
                result, burst = await _phases(submit, arrivals, load, answered=via == "http")
        finally:
            await client.close()
    result.pop("offered_started_at", None)
    result.pop("witness", None)  # it watched the load's loop, not the scheduler's
    return {**result, "burst_ids": list(burst.due), "burst_pending": burst.pending}


def default_runs(nodes: Sequence[int], vias: Sequence[Via]) -> list[SchedulerRun]:
    """`in-process` with one shape (the shortcut figure kept as it was measured), the other ways with the
    trace's shapes, each at the first node count; then `http` at each further node count."""
    first, *more = nodes
    runs = [SchedulerRun(via, first, mixed_shapes=via != "in-process") for via in vias]
    return runs + [SchedulerRun("http", count, mixed_shapes=True) for count in more]


def run_scheduler_benchmark(
    runs: Sequence[SchedulerRun],
    *,
    scratch_database: ScratchDatabase,
    nats_url: str,
    shapes: Sequence[PlacementRequest] = (),
    gpus_per_node: int = 8,
    pods: int = 20_000,
    concurrency: int = 64,
    offered_rate: float = 200.0,
    offered_pods: int = 2_000,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Each of `runs` on its own scratch database (`scratch_database()`) and `nats_url`: a burst of
    `pods` submitted `concurrency` at a time, then `offered_pods` offered at `offered_rate`/s.

    Returns `{"runs": [...]}`, each with its `via`, `nodes`, `mixed_shapes`; `burst` and `offered`
    (`placed`, `pending`, `placements_per_second`, `p50_ms` / `p90_ms` / `p99_ms` / `max_ms` until
    the allocation event arrived, from the intended send time under offered load; `answered_p99_ms`
    until the submission was answered); `baseline_reserve_many` (the same reservations by the ledger
    alone in the scheduler's batch sizes) and `ratio` (burst placements/s over its reservations/s);
    and, for the in-process run, `tail` (batch times, relay passes, garbage collection, loop lag while
    offered).
    """
    if not runs:
        raise BenchmarkError("--via / --nodes: give at least one run")
    if gpus_per_node < 1 or pods < 1 or any(run.nodes < 1 for run in runs):
        raise BenchmarkError("--nodes, --gpus-per-node and --pods: each must be at least 1")
    if concurrency < 1:
        raise BenchmarkError("--concurrency: must be at least 1")
    if offered_pods and offered_rate <= 0:
        raise BenchmarkError("--offered-rate: must be above 0 (or pass --offered-pods 0 to skip it)")
    measured = []
    for position, run in enumerate(runs, start=1):
        if progress is not None:
            progress(
                f"run {position}/{len(runs)}: {run.label()}, {pods} pods, "
                f"then {offered_pods} at {offered_rate:g}/s"
            )
        with scratch_database() as url:
            measured.append(
                asyncio.run(
                    _measure(
                        run,
                        url,
                        nats_url,
                        gpus_per_node=gpus_per_node,
                        pods=pods,
                        concurrency=concurrency,
                        offered_rate=offered_rate,
                        offered_pods=offered_pods,
                        shapes=shapes,
                    )
                )
            )
    return {"benchmark": "scheduler", "pods": pods, "offered_pods": offered_pods, "runs": measured}

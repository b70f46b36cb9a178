"""Events per second through the ledger outbox (`tfctl bench outbox`), against bare `js.publish`.

`measure_outbox(database_url, nats_url, ...)` writes `events` allocation events into the outbox table
of a migrated ledger, then drains them with `OutboxRelay.publish_pending()` (claim a batch, publish
each event and wait for its JetStream ack, mark the batch published, commit) until none is left. The
baseline, in the same run, publishes the same payloads with a bare `js.publish` each, also waiting for
each ack. Both go to a stream of the run's own (`TF_BENCH_<id>`, subjects `tf.bench.<id>.>`, same
storage and duplicate window as `TF_EVENTS`), deleted afterwards, so no consumer of `tf.evt.>` sees
them. A core subscription counts what arrives and the stream counts what it stored; both must equal
`events`, and every outbox row must be marked published. `run_outbox_benchmark(...)` adds the
servers (embedded unless URLs are given) and a scratch database. This module only measures.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

from nats.aio.msg import Msg
from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import create_async_engine
from tfcommon import subjects
from tfcommon.bus import NatsEventBus
from tfcommon.events import AllocationCreated, GpuShare, WorkloadRef
from tfcommon.ledger import tables
from tfcommon.ledger.outbox import OutboxRelay
from tfcommon.ledger.urls import ledger_url

from tfctl.bench_servers import nats_server, postgres_server, scratch_database

DEFAULT_EVENTS = 2000
DEFAULT_BATCH_SIZE = 100
INSERT_CHUNK = 1000
ARRIVAL_TIMEOUT_S = 30.0


class OutboxBenchmarkError(ValueError):
    """A parameter is out of range, or an event was lost or doubled on its way to the stream."""


def _check(events: int, batch_size: int) -> None:
    if events < 1:
        raise OutboxBenchmarkError(f"--events: {events}; give at least 1")
    if batch_size < 1:
        raise OutboxBenchmarkError(f"--batch-size: {batch_size}; give at least 1 event per relay pass")


def _events(count: int, run: str) -> list[AllocationCreated]:
    now = datetime.now(UTC)
    return [
        AllocationCreated(
            event_id=uuid4(),
            occurred_at=now,
            cause=uuid4(),
            allocation_id=uuid4(),
            workload=WorkloadRef(namespace="bench-outbox", name=f"{run}-{n}", uid=str(uuid4())),
            pool="default",
            node=f"{run}-node-{n % 100}",
            shares=(GpuShare(gpu_uuid=f"{run}-gpu-{n % 800}", tflops_milli=2_000, vram_bytes=2 * 1024**3),),
            qos="medium",
            isolation="soft",
        )
        for n in range(count)
    ]


async def measure_outbox(
    database_url: str, nats_url: str, *, events: int = DEFAULT_EVENTS, batch_size: int = DEFAULT_BATCH_SIZE
) -> dict[str, Any]:
    """Events per second published by the outbox relay and by bare `js.publish`, and their ratio.

    `database_url` must be a migrated ledger whose outbox holds no unpublished events (a fresh one).
    Raises `OutboxBenchmarkError` when a count differs from `events`.
    """
    _check(events, batch_size)
    run = uuid4().hex[:8]
    stream = subjects.StreamSpec(
        name=f"TF_BENCH_{run.upper()}",
        subjects=(f"tf.bench.{run}.>",),
        retention="limits",
        description="tfctl bench outbox: deleted when the run ends",
        duplicate_window_s=subjects.EVENTS.duplicate_window_s,
        storage=subjects.EVENTS.storage,
    )
    relay_subject, bare_subject = f"tf.bench.{run}.relay", f"tf.bench.{run}.bare"
    batch = _events(events, run)
    engine = create_async_engine(ledger_url(database_url), pool_size=2)
    bus = await NatsEventBus.connect(nats_url, service="outbox-bench")
    received: dict[str, int] = {}
    all_arrived = asyncio.Event()

    async def arrived(message: Msg) -> None:
        received[message.subject] = received.get(message.subject, 0) + 1
        if min(received.get(relay_subject, 0), received.get(bare_subject, 0)) >= events:
            all_arrived.set()

    try:
        await subjects.provision_stream(bus.js, stream)
        subscription = await bus.nc.subscribe(f"tf.bench.{run}.>", cb=arrived)
        async with engine.begin() as connection:
            rows = [
                {
                    "event_id": event.event_id,
                    "subject": relay_subject,
                    "event_type": event.event_type(),
                    "payload": event.model_dump(mode="json"),
                    "occurred_at": event.occurred_at,
                }
                for event in batch
            ]
            for start in range(0, len(rows), INSERT_CHUNK):
                await connection.execute(insert(tables.outbox), rows[start : start + INSERT_CHUNK])
        payloads = [event.model_dump_json().encode() for event in batch]

        started = time.perf_counter()
        for payload in payloads:
            await bus.js.publish(bare_subject, payload)
        bare_s = time.perf_counter() - started

        relay = OutboxRelay(engine, bus, batch_size=batch_size)
        started = time.perf_counter()
        relayed = 0
        while published := await relay.publish_pending():
            relayed += published
        relay_s = time.perf_counter() - started

        with contextlib.suppress(TimeoutError):  # a shortfall is reported below
            await asyncio.wait_for(all_arrived.wait(), ARRIVAL_TIMEOUT_S)
        await subscription.unsubscribe()
        stored = (await bus.js.stream_info(stream.name, subjects_filter=">")).state.subjects or {}
        async with engine.connect() as connection:
            unpublished = await connection.scalar(
                select(func.count()).select_from(tables.outbox).where(tables.outbox.c.published_at.is_(None))
            )
    finally:
        try:
            await bus.js.delete_stream(stream.name)
        finally:
            await bus.close()
            await engine.dispose()
    counts = {
        "relayed": relayed,
        "relay_received": received.get(relay_subject, 0),
        "relay_stored": stored.get(relay_subject, 0),
        "bare_received": received.get(bare_subject, 0),
        "bare_stored": stored.get(bare_subject, 0),
        "outbox_unpublished": int(unpublished or 0),
    }
    if counts["outbox_unpublished"] or any(
        value != events for key, value in counts.items() if key != "outbox_unpublished"
    ):
        raise OutboxBenchmarkError(f"expected {events} events relayed, received and stored; found {counts}")
    relay_rate, bare_rate = events / relay_s, events / bare_s
    return {
        "benchmark": "outbox-relay",
        "events": events,
        "batch_size": batch_size,
        "payload_bytes": round(sum(len(payload) for payload in payloads) / events),
        "relay": {"seconds": round(relay_s, 3), "events_per_second": round(relay_rate, 1)},
        "bare_publish": {"seconds": round(bare_s, 3), "events_per_second": round(bare_rate, 1)},
        "ratio": round(relay_rate / bare_rate, 3),
        "counts": counts,
        "baseline": "bare js.publish of the same payloads, one at a time, each waiting for its ack",
    }


def run_outbox_benchmark(
    events: int = DEFAULT_EVENTS,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    database_url: str | None = None,
    nats_url: str | None = None,
) -> dict[str, Any]:
    """`measure_outbox` on a scratch database and the given servers (embedded ones for None)."""
    _check(events, batch_size)
    with (
        postgres_server(database_url) as server_url,
        nats_server(nats_url) as bus_url,
        scratch_database(server_url, "bench_outbox") as url,
    ):
        return asyncio.run(measure_outbox(url, bus_url, events=events, batch_size=batch_size))

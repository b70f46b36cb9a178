"""The dashboard's pool history on a real Postgres ledger and real NATS JetStream: the metrics service
samples each pool, a restarted service still serves the samples taken before, and samples older than
24 hours are deleted. The service runs on a stepped clock, so each step is exactly one sample."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
from support.clocks import SteppedClock
from support.polling import eventually
from support.scratch_database import libpq_conninfo
from support.serving import serving
from tfcommon.events import WorkloadRef
from tfcommon.infra import free_port
from tfcommon.ledger.records import GpuSpec, NodeSpec, ReservationRequest, Reserved, ShareRequest
from tfcommon.ledger.sql import SqlLedger
from tfcommon.settings import DatabaseSettings, MetricsSettings, NatsSettings
from tfmetrics.app import build

pytestmark = pytest.mark.integration

GIB = 1024**3
T0 = datetime(2026, 12, 1, 0, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


@pytest.fixture
def database_url(migrated_database_url: str) -> str:
    return migrated_database_url


@contextlib.asynccontextmanager
async def metrics_service(database_url: str, nats_url: str, clock: SteppedClock) -> AsyncIterator[str]:
    """A metrics service on `clock`, sampling once a minute of that clock; yields its URL once ready."""
    settings = MetricsSettings(
        nats=NatsSettings(url=nats_url),
        database=DatabaseSettings(url=database_url),
        port=free_port(),
        bind_host="127.0.0.1",
        refresh_interval_s=0.1,
        history_interval_s=60,
    )
    async with serving(build(settings, clock=clock)) as served:
        yield served.url
    assert served.task.done()


async def history_of(base_url: str, **params: Any) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(f"{base_url}/api/v1/dashboard/history", params=params)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body


async def samples_until(base_url: str, moment: datetime) -> dict[str, Any]:
    """The pool's columns once the sample taken at `moment` is served."""

    async def probe() -> dict[str, Any] | None:
        pools = (await history_of(base_url))["pools"]
        if pools and pools[0]["t"] and pools[0]["t"][-1] == epoch_ms(moment):
            pool: dict[str, Any] = pools[0]
            return pool
        return None

    return await eventually(probe)


async def released_in_view(base_url: str) -> bool | None:
    """True once the service's snapshot shows no allocation (one read after the release)."""
    async with httpx.AsyncClient(timeout=10) as client:
        view = (await client.get(f"{base_url}/api/v1/dashboard")).json()
    return True if view["allocations"] == [] else None


def epoch_ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


def stored_sample_times(database_url: str) -> list[datetime]:
    with psycopg.connect(libpq_conninfo(database_url)) as connection:
        rows = connection.execute("SELECT sampled_at FROM metrics_pool_sample ORDER BY sampled_at").fetchall()
    return [row[0] for row in rows]


def a_defrag_campaign(database_url: str, started: datetime, minutes: int) -> None:
    with psycopg.connect(libpq_conninfo(database_url), autocommit=True) as connection:
        connection.execute(
            "INSERT INTO defrag_campaign (id, pool_name, trigger, state, started_at, finished_at, outcome,"
            " drained_nodes, failed_nodes, skipped_nodes, pods_evicted, stranded_pods)"
            " VALUES (%s, 'history', 'cron', 'finished', %s, %s, 'completed', '[]', '{}', '{}', 2, 0)",
            (uuid.uuid4(), started, started + timedelta(minutes=minutes)),
        )


async def test_samples_survive_a_restart_and_are_deleted_after_24_hours(
    database_url: str, nats_url: str
) -> None:
    clock = SteppedClock(T0)
    ledger = SqlLedger.create(database_url, clock=clock)
    await ledger.upsert_node(NodeSpec(name="hist-node", pool="history"))
    gpus = [f"gpu-{uuid.uuid4()}" for _ in range(2)]
    for index, gpu in enumerate(gpus):
        await ledger.upsert_gpu(GpuSpec(gpu, "hist-node", index, "H100", "nvidia", 100_000, 80 * GIB))
    held = await ledger.reserve(
        ReservationRequest(
            allocation_id=uuid.uuid4(),
            workload=WorkloadRef(namespace="team-a", name="trainer-0", workload="trainer"),
            pool="history",
            node="hist-node",
            shares=(ShareRequest(gpus[0], 50_000, 40 * GIB),),
        )
    )
    assert isinstance(held, Reserved)
    await asyncio.to_thread(a_defrag_campaign, database_url, T0 - HOUR, 20)
    await asyncio.to_thread(a_defrag_campaign, database_url, T0 + HOUR / 2, 20)
    try:
        async with metrics_service(database_url, nats_url, clock) as first:
            pool = await samples_until(first, T0)
            assert pool["name"] == "history"
            assert (pool["allocatedTflopsPercent"], pool["allocatedVramPercent"]) == ([25.0], [25.0])
            assert pool["wholeIdleGpus"] == [1]
            assert await ledger.release(held.allocation.allocation_id, "pod-deleted")
            await eventually(lambda: released_in_view(first))
            clock.now = T0 + HOUR
            pool = await samples_until(first, T0 + HOUR)
            assert pool["allocatedTflopsPercent"] == [25.0, 0.0]
        assert await asyncio.to_thread(stored_sample_times, database_url) == [T0, T0 + HOUR]

        clock.now = T0 + 2 * HOUR
        async with metrics_service(database_url, nats_url, clock) as second:
            pool = await samples_until(second, T0 + 2 * HOUR)
            assert pool["t"] == [epoch_ms(T0), epoch_ms(T0 + HOUR), epoch_ms(T0 + 2 * HOUR)]
            assert pool["allocatedTflopsPercent"] == [25.0, 0.0, 0.0]

            later = T0 + 24 * HOUR + HOUR / 2
            clock.now = later
            pool = await samples_until(second, later)
            assert pool["t"] == [epoch_ms(T0 + HOUR), epoch_ms(T0 + 2 * HOUR), epoch_ms(later)]
            assert await asyncio.to_thread(stored_sample_times, database_url) == [
                T0 + HOUR,
                T0 + 2 * HOUR,
                later,
            ]
            day = await history_of(second)
            assert day["windowStart"] == (later - 24 * HOUR).isoformat()
            assert [mark["startedAt"] for mark in day["campaigns"]] == [(T0 + HOUR / 2).isoformat()]
            last_hour = await history_of(second, hours=1)
            assert last_hour["pools"][0]["t"] == [epoch_ms(later)]
            assert last_hour["campaigns"] == []
            async with httpx.AsyncClient(timeout=10) as client:
                refused = await client.get(f"{second}/api/v1/dashboard/history", params={"hours": 25})
            assert refused.status_code == 422
            assert "hours" in refused.text
            assert "24" in refused.text
    finally:
        await ledger.close()

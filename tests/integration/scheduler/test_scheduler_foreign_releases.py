"""The scheduler follows allocation releases made by other processes (issues #5/#6): a node agent, the
defrag planner, an operator or another replica closes an allocation in the ledger; the outbox announces
`tf.evt.allocation.released`, and the scheduler's `scheduler-track-allocations` consumer frees the
capacity in its view, ends the workload with the ledger's reason and places what was waiting, long
before the periodic full refresh (set to an hour here). Its own releases and a second delivery of the
same release change nothing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import httpx
import pytest
from pydantic import SecretStr
from scheduler_builders import GIB, a_submission, register_named_node
from scheduler_service import TOKEN, eventually, private_nats
from tfcommon import subjects
from tfcommon.bus import NatsEventBus
from tfcommon.events import AllocationReleased
from tfcommon.infra import free_port
from tfcommon.ledger.sql import SqlLedger
from tfcommon.runtime import serve
from tfcommon.settings import DatabaseSettings, NatsSettings, SchedulerSettings
from tfscheduler.app import build

pytestmark = pytest.mark.integration
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NODE = "foreign-release-node"
FULL_GPU = 100_000
FOLLOW_WITHIN_S = 10.0


@pytest.fixture
def own_nats_url(tmp_path: Path) -> Iterator[str]:
    with private_nats(tmp_path / "nats") as url:
        yield url


@contextlib.asynccontextmanager
async def scheduler_service(
    ledger: SqlLedger, database_url: str, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[httpx.AsyncClient]:
    """One GPU of 100 TFLOPS on `NODE`, then the scheduler service (with its outbox relay) over it."""
    await register_named_node(ledger, NODE, 1, tflops_milli=FULL_GPU)
    monkeypatch.setenv("TF_SCHEDULER_HEARTBEAT_TIMEOUT_S", "3600")
    monkeypatch.setenv("TF_SCHEDULER_REFRESH_INTERVAL_S", "3600")
    port = free_port()
    settings = SchedulerSettings(
        nats=NatsSettings(url=nats_url),
        database=DatabaseSettings(url=database_url),
        api_token=SecretStr(TOKEN),
        port=port,
        bind_host="127.0.0.1",
    )
    stop = asyncio.Event()
    service = asyncio.create_task(serve(build(settings), stop=stop))
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:

            async def ready() -> bool | None:
                assert not service.done(), service
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get("/readyz")).status_code == 200:
                        return True
                return None

            await eventually(ready, timeout_s=30)
            yield client
    finally:
        stop.set()
        await asyncio.wait_for(service, timeout=30)


async def submit(client: httpx.AsyncClient, tflops_milli: int) -> dict[str, Any]:
    body = a_submission(tflops_milli=tflops_milli, vram_bytes=8 * GIB).model_dump(mode="json")
    response = await client.post("/api/v1/workloads", json=body, headers=AUTH)
    assert response.status_code in (201, 202), response.text
    status: dict[str, Any] = response.json()
    return status


async def workload(client: httpx.AsyncClient, workload_id: str) -> dict[str, Any]:
    response = await client.get(f"/api/v1/workloads/{workload_id}")
    assert response.status_code == 200, response.text
    status: dict[str, Any] = response.json()
    return status


async def view_fits(client: httpx.AsyncClient, tflops_milli: int) -> bool:
    """Whether the scheduler's in-memory view has room for this much on one GPU (changes nothing)."""
    body = a_submission(tflops_milli=tflops_milli, vram_bytes=8 * GIB).model_dump(mode="json")
    response = await client.post("/api/v1/simulate-schedule", json=body)
    assert response.status_code == 200, response.text
    return bool(response.json()["placed"])


async def consumed_releases(bus: NatsEventBus, count: int) -> None:
    """Wait until the scheduler has handled and acknowledged `count` release events."""

    async def done() -> bool | None:
        info = await bus.js.consumer_info(
            subjects.EVENTS_STREAM, subjects.SCHEDULER_TRACK_ALLOCATIONS.durable
        )
        handled = info.ack_floor.consumer_seq if info.ack_floor and info.ack_floor.consumer_seq else 0
        return True if handled >= count and not info.num_pending and not info.num_ack_pending else None

    await eventually(done, timeout_s=FOLLOW_WITHIN_S)


async def test_a_release_by_another_process_frees_the_gpu_ends_the_workload_and_places_the_waiting_one(
    ledger: SqlLedger, database_url: str, own_nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with scheduler_service(ledger, database_url, own_nats_url, monkeypatch) as client:
        running = await submit(client, 60_000)
        assert (running["state"], running["node"]) == ("placed", NODE)
        waiting = await submit(client, 60_000)
        assert waiting["state"] == "pending"
        assert not await view_fits(client, 41_000)

        # The node agent ends the worker it started (StartWorker): it releases in the ledger itself.
        assert await ledger.release(UUID(running["id"]), "worker exited with code 0")

        async def followed() -> dict[str, Any] | None:
            ended = await workload(client, running["id"])
            placed = await workload(client, waiting["id"])
            return placed if ended["state"] == "ended" and placed["state"] == "placed" else None

        placed = await eventually(followed, timeout_s=FOLLOW_WITHIN_S)
        ended = await workload(client, running["id"])
        assert ended["reason"] == "worker exited with code 0"
        assert (placed["node"], placed["gpu_uuids"]) == (NODE, running["gpu_uuids"])
        assert await view_fits(client, 40_000)  # 60 of 100 used: the released 60 are free in the view
        assert not await view_fits(client, 41_000)
        [gpu] = (await client.get("/api/v1/gpus")).json()
        assert gpu["available_tflops_milli"] == 40_000


async def test_own_releases_and_a_second_delivery_of_a_release_change_nothing(
    ledger: SqlLedger, database_url: str, own_nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = await NatsEventBus.connect(own_nats_url, service="operator")
    try:
        async with scheduler_service(ledger, database_url, own_nats_url, monkeypatch) as client:
            first = await submit(client, FULL_GPU)
            assert first["state"] == "placed"
            deleted = await client.delete(f"/api/v1/workloads/{first['id']}", headers=AUTH)
            assert deleted.json() == {"id": first["id"], "released": True}
            second = await submit(client, FULL_GPU)
            assert second["state"] == "placed"

            # The scheduler's own release comes back as an event: it frees nothing a second time.
            await consumed_releases(bus, 1)
            assert not await view_fits(client, 1_000)
            assert (await workload(client, second["id"]))["state"] == "placed"
            assert (await workload(client, first["id"]))["reason"] == "workload-deleted"

            # An operator releases the second one in the ledger: followed once.
            assert await ledger.release(UUID(second["id"]), "released by an operator")

            async def ended() -> dict[str, Any] | None:
                status = await workload(client, second["id"])
                return status if status["state"] == "ended" else None

            assert (await eventually(ended, timeout_s=FOLLOW_WITHIN_S))["reason"] == "released by an operator"
            third = await submit(client, FULL_GPU)
            assert third["state"] == "placed"

            # The same release delivered again (a republish under another message id): nothing changes.
            record = await ledger.get_allocation(UUID(second["id"]))
            assert record is not None
            await bus.publish(
                AllocationReleased(
                    event_id=uuid4(),
                    occurred_at=datetime.now(UTC),
                    allocation_id=record.allocation_id,
                    workload=record.workload,
                    node=record.node,
                    reason="released by an operator",
                )
            )
            await consumed_releases(bus, 3)
            assert not await view_fits(client, 1_000)
            assert (await workload(client, third["id"]))["state"] == "placed"
            assert (await workload(client, second["id"]))["reason"] == "released by an operator"
    finally:
        await bus.close()

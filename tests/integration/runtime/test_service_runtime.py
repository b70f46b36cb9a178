"""The shared service runtime against real NATS JetStream and real Postgres: health, readiness,
plug-in components, shutdown order, failures, HTTPS."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import uuid4

import httpx
import pytest
from fastapi import APIRouter
from support.polling import eventually
from tfcommon import subjects
from tfcommon.bus import EventBus
from tfcommon.events import Message, NodeHeartbeatSent
from tfcommon.infra import EmbeddedNats, free_port
from tfcommon.runtime import (
    Components,
    ServiceContext,
    ServiceFailedError,
    ServiceSpec,
    Timer,
    no_components,
    serve,
)
from tfcommon.settings import DatabaseSettings, NatsSettings, SchedulerSettings, WebhookSettings

pytestmark = pytest.mark.integration


@asynccontextmanager
async def running(spec: ServiceSpec[Any]) -> AsyncIterator[asyncio.Task[None]]:
    """Run `spec` in this event loop; on exit ask it to stop and wait for `serve` to return."""
    stop = asyncio.Event()
    service = asyncio.create_task(serve(spec, stop=stop))
    try:
        yield service
    finally:
        stop.set()
        await asyncio.wait({service}, timeout=30)
        assert service.done(), "serve() did not return within 30s of stop"


def scheduler_settings(nats_url: str, database_url: str) -> SchedulerSettings:
    return SchedulerSettings(nats=NatsSettings(url=nats_url), database=DatabaseSettings(url=database_url))


def spec_for(
    settings: SchedulerSettings, compose: Callable[[ServiceContext[SchedulerSettings]], Awaitable[Components]]
) -> ServiceSpec[SchedulerSettings]:
    return ServiceSpec(
        name="scheduler", settings=settings, port=free_port(), host="127.0.0.1", compose=compose
    )


async def readyz(base_url: str, status: int) -> dict[str, Any] | None:
    async with httpx.AsyncClient(timeout=5) as client:
        try:
            response = await client.get(f"{base_url}/readyz")
        except httpx.TransportError:
            return None
    return response.json() if response.status_code == status else None


async def test_readyz_turns_503_naming_nats_when_nats_goes_down(
    own_nats: EmbeddedNats, database_url: str
) -> None:
    spec = spec_for(scheduler_settings(own_nats.url, database_url), no_components)
    base_url = f"http://127.0.0.1:{spec.port}"
    async with running(spec) as service:
        ready = await eventually(lambda: readyz(base_url, 200))
        assert ready["checks"] == {"nats": "ok", "postgres": "ok"}
        own_nats.stop()
        down = await eventually(lambda: readyz(base_url, 503))
        assert down["down"] == ["nats"]
        assert down["status"] == "not ready"
        assert down["checks"]["postgres"] == "ok"
    assert service.result() is None, "a service stops cleanly even when NATS is gone"


async def test_readyz_names_postgres_when_the_ledger_database_disappears(
    nats_url: str, database_url: str, drop_database: Callable[[str], None]
) -> None:
    spec = spec_for(scheduler_settings(nats_url, database_url), no_components)
    base_url = f"http://127.0.0.1:{spec.port}"
    async with running(spec):
        await eventually(lambda: readyz(base_url, 200))
        drop_database(database_url)
        down = await eventually(lambda: readyz(base_url, 503))
        assert down["down"] == ["postgres"]
        assert "SELECT 1 failed" in down["checks"]["postgres"]


async def test_components_are_served_and_stopped_before_cleanup(nats_url: str, database_url: str) -> None:
    happened: list[str] = []
    router = APIRouter()

    @router.get("/hello")
    async def hello() -> dict[str, str]:
        return {"hello": "world"}

    async def compose(context: ServiceContext[SchedulerSettings]) -> Components:
        async def drain_queue() -> None:
            await context.stopping.wait()
            happened.append("task finished in-flight work")

        async def close_resource() -> None:
            happened.append("cleanup closed")

        context.cleanup.push_async_callback(close_resource)
        return Components(routers=[router], tasks={"drain-queue": drain_queue})

    spec = spec_for(scheduler_settings(nats_url, database_url), compose)
    base_url = f"http://127.0.0.1:{spec.port}"
    async with running(spec) as service:
        await eventually(lambda: readyz(base_url, 200))
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"{base_url}/hello")).json() == {"hello": "world"}
            health = (await client.get(f"{base_url}/healthz")).json()
        assert health == {"service": "scheduler", "status": "alive"}
        assert happened == []
    assert service.result() is None
    assert happened == ["task finished in-flight work", "cleanup closed"]


async def test_a_failing_background_task_stops_the_service_with_its_reason(
    nats_url: str, database_url: str
) -> None:
    async def compose(context: ServiceContext[SchedulerSettings]) -> Components:
        async def broken_loop() -> None:
            raise RuntimeError("ledger schema is missing table gpu")

        return Components(tasks={"rebuild-view": broken_loop})

    spec = spec_for(scheduler_settings(nats_url, database_url), compose)
    with pytest.raises(ServiceFailedError, match="rebuild-view failed: ledger schema is missing table gpu"):
        await asyncio.wait_for(serve(spec, stop=asyncio.Event()), timeout=30)


async def test_declared_handlers_consume_published_messages_and_timers_tick_until_stopped(
    nats_url: str, database_url: str
) -> None:
    node = f"runtime-{uuid4().hex[:8]}"
    heard: list[NodeHeartbeatSent] = []
    ticks: list[str] = []
    buses: list[EventBus] = []

    async def track_nodes(message: Message) -> Sequence[Message]:
        if isinstance(message, NodeHeartbeatSent) and message.node == node:
            heard.append(message)
        return ()

    async def tick() -> None:
        ticks.append("tick")
        if len(ticks) == 2:
            raise RuntimeError("one round fails; the timer goes on")

    async def compose(context: ServiceContext[SchedulerSettings]) -> Components:
        buses.append(context.bus)
        return Components(
            handlers={subjects.SCHEDULER_TRACK_NODES: track_nodes},
            timers={"tick": Timer(0.02, tick, at_start=True)},
        )

    spec = spec_for(scheduler_settings(nats_url, database_url), compose)
    base_url = f"http://127.0.0.1:{spec.port}"
    async with running(spec) as service:
        await eventually(lambda: readyz(base_url, 200))
        heartbeat = NodeHeartbeatSent(
            event_id=uuid4(),
            occurred_at=datetime.now(UTC),
            node=node,
            pool="default",
            gpu_count=1,
            interval_ms=1_000,
        )
        await buses[0].publish(heartbeat)
        await eventually(lambda: heard or None, "the handler received the heartbeat")
        await eventually(lambda: len(ticks) >= 4, "the timer ticked past its failed round")
    assert service.result() is None, "handlers and timers stop cleanly"
    assert [message.event_id for message in heard] == [heartbeat.event_id]
    stopped_at = len(ticks)
    await asyncio.sleep(0.1)
    assert len(ticks) == stopped_at, "no round after the service stopped"


async def test_an_extra_readiness_check_can_hold_readiness(nats_url: str, database_url: str) -> None:
    loaded = asyncio.Event()

    async def config_loaded() -> str | None:
        return None if loaded.is_set() else "configuration not loaded yet"

    async def compose(context: ServiceContext[SchedulerSettings]) -> Components:
        return Components(readiness={"config": config_loaded})

    spec = spec_for(scheduler_settings(nats_url, database_url), compose)
    base_url = f"http://127.0.0.1:{spec.port}"
    async with running(spec):
        waiting = await eventually(lambda: readyz(base_url, 503))
        assert waiting["down"] == ["config"]
        assert waiting["checks"]["config"] == "configuration not loaded yet"
        loaded.set()
        await eventually(lambda: readyz(base_url, 200))


async def test_webhook_serves_https_with_a_generated_self_signed_certificate(
    tmp_path: Path, nats_url: str, database_url: str
) -> None:
    from tfwebhook.app import build

    port = free_port()
    settings = WebhookSettings(
        nats=NatsSettings(url=nats_url), database=DatabaseSettings(url=database_url), port=port
    )
    spec = build(settings, state_dir=tmp_path)
    assert spec.tls is not None
    assert spec.tls.cert_file == tmp_path / "certs" / "tls.crt"
    trust = ssl.create_default_context(cafile=str(spec.tls.cert_file))

    async def ready_over_tls() -> int | None:
        async with httpx.AsyncClient(verify=trust, timeout=5) as client:
            try:
                response = await client.get(f"https://127.0.0.1:{port}/readyz")
            except httpx.TransportError:
                return None
        return response.status_code if response.status_code == 200 else None

    async with running(spec):
        assert await eventually(ready_over_tls) == 200
        async with httpx.AsyncClient(timeout=5) as plain:
            with pytest.raises(httpx.TransportError):
                await plain.get(f"http://127.0.0.1:{port}/healthz")


async def test_a_service_whose_port_is_still_held_waits_for_it_and_then_serves(
    nats_url: str, database_url: str
) -> None:
    """A restarted service can find its port still held a moment by the process it replaces: it waits
    (up to `PORT_WAIT_S`) instead of exiting."""
    spec = spec_for(scheduler_settings(nats_url, database_url), no_components)
    base_url = f"http://127.0.0.1:{spec.port}"
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", spec.port))
    holder.listen(1)
    try:
        async with running(spec) as service:
            await asyncio.sleep(1.5)
            assert not service.done(), "the service waits for its port instead of failing"
            holder.close()
            ready = await eventually(lambda: readyz(base_url, 200))
            assert ready["status"] == "ready"
    finally:
        holder.close()

"""The node-agent service as `tfctl serve node-agent` runs it: simulated GPUs, real NATS, and no database
(the agent holds no database credential: it asks the scheduler for what it needs from the ledger)."""

from __future__ import annotations

import asyncio
from uuid import uuid4

import httpx
import pytest
from nats.aio.msg import Msg
from pydantic import SecretStr
from tfagent.app import build
from tfcommon.bus import NatsEventBus
from tfcommon.events import NodeRegistered, decode
from tfcommon.infra import free_port
from tfcommon.runtime import StartupError, serve
from tfcommon.settings import AgentSettings, DatabaseSettings, NatsSettings

pytestmark = pytest.mark.integration


def agent_settings(nats_url: str, node: str, fake_gpus: str) -> AgentSettings:
    return AgentSettings(
        nats=NatsSettings(url=nats_url),
        database=DatabaseSettings(url=None),
        bind_host="127.0.0.1",
        port=free_port(),
        node_name=node,
        fake_gpus=fake_gpus,
        api_token=SecretStr("token"),
        heartbeat_interval_s=0.5,
    )


async def test_serves_simulated_gpus_on_the_hypervisor_api_and_registers_on_the_bus_without_a_database(
    nats_url: str,
) -> None:
    node = f"node-{uuid4().hex[:10]}"
    settings = agent_settings(nats_url, node, "A100-80G:2")
    listener = await NatsEventBus.connect(nats_url, service="agent-test")
    registrations: list[NodeRegistered] = []

    async def on_message(msg: Msg) -> None:
        message = decode(msg.subject, msg.data)
        if isinstance(message, NodeRegistered) and message.node == node:
            registrations.append(message)

    await listener.nc.subscribe(NodeRegistered.subject, cb=on_message)
    stop = asyncio.Event()
    service = asyncio.create_task(serve(build(settings), stop=stop))
    try:
        deadline = asyncio.get_running_loop().time() + 30
        devices: list[dict[str, object]] = []
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{settings.port}", timeout=5) as client:
            while len(devices) != 2 or not registrations:
                assert asyncio.get_running_loop().time() < deadline, "the agent did not come up within 30s"
                assert not service.done(), f"the agent stopped: {service.exception()!r}"
                try:
                    devices = (await client.get("/api/v1/devices")).json()["data"]
                except httpx.TransportError:
                    devices = []
                await asyncio.sleep(0.05)
            refused = await client.post("/api/v1/devices/discover")
            ready = await client.get("/readyz")
    finally:
        stop.set()
        await asyncio.wait_for(service, timeout=30)
        await listener.close()

    assert {d["model"] for d in devices} == {"A100-80G"}
    assert all(d["simulated"] for d in devices)
    assert registrations[0].simulated
    assert registrations[0].agent_url == f"http://{node}:{settings.port}"
    assert refused.status_code == 401
    assert ready.status_code == 200, ready.text
    assert set(ready.json()["checks"]) == {"nats"}


async def test_a_bad_fake_gpus_value_stops_start_up_with_the_fix(nats_url: str) -> None:
    settings = agent_settings(nats_url, "node-bad", "H100x8")

    with pytest.raises(StartupError, match=r"--fake-gpus: 'H100x8' is not MODEL:COUNT"):
        await asyncio.wait_for(serve(build(settings), stop=asyncio.Event()), timeout=30)


async def test_without_nats_it_names_only_what_it_needs() -> None:
    settings = AgentSettings(nats=NatsSettings(url=None), database=DatabaseSettings(url=None))

    with pytest.raises(
        StartupError, match=r"^TF_NATS_URL not set: this service needs the bus \(and no database\)"
    ):
        await asyncio.wait_for(serve(build(settings), stop=asyncio.Event()), timeout=30)

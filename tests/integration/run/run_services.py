"""A scheduler and a node agent with simulated GPUs, in-process over real NATS and Postgres, for `tfctl run`.
Only the scheduler has the database URL: the agent reaches the ledger through it, over NATS.

The fixtures are re-exported by this folder's conftest.py.
The agent serves a node and pool of its own, so placement in these tests only ever picks its GPUs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

import httpx
import pytest
from pydantic import SecretStr
from support.scratch_database import scratch_database
from tfagent.app import build as build_agent
from tfcommon.infra import free_port
from tfcommon.ledger.sql import SqlLedger
from tfcommon.runtime import serve
from tfcommon.settings import AgentSettings, DatabaseSettings, NatsSettings, SchedulerSettings
from tfscheduler.app import build as build_scheduler

TOKEN = "run-test-token"
NODE_GPUS = 2
READY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class RunStack:
    scheduler_url: str
    agent_url: str
    node: str
    pool: str
    ledger: SqlLedger
    gpus: tuple[dict[str, Any], ...]


@pytest.fixture(scope="module")
def run_database_url(postgres_server_url: str) -> Iterator[str]:
    with scratch_database(postgres_server_url, "run") as url:
        yield url


@pytest.fixture(scope="module")
async def run_stack(nats_url: str, run_database_url: str) -> AsyncIterator[RunStack]:
    node, pool = f"run-node-{uuid4().hex[:8]}", f"run-pool-{uuid4().hex[:8]}"
    nats, database, token = (
        NatsSettings(url=nats_url),
        DatabaseSettings(url=run_database_url),
        SecretStr(TOKEN),
    )
    scheduler_settings = SchedulerSettings(
        nats=nats, database=database, bind_host="127.0.0.1", api_token=token, port=free_port()
    )
    agent_settings = AgentSettings(
        nats=nats,
        database=DatabaseSettings(url=None),  # the agent asks the scheduler; it holds no database URL
        bind_host="127.0.0.1",
        api_token=token,
        port=free_port(),
        node_name=node,
        pool=pool,
        fake_gpus=f"H100:{NODE_GPUS}",
        heartbeat_interval_s=0.5,
    )
    stop = asyncio.Event()
    services = [
        asyncio.create_task(serve(build_scheduler(scheduler_settings), stop=stop)),
        asyncio.create_task(serve(build_agent(agent_settings), stop=stop)),
    ]
    scheduler_url = f"http://127.0.0.1:{scheduler_settings.port}"
    agent_url = f"http://127.0.0.1:{agent_settings.port}"
    ledger = SqlLedger.create(run_database_url, pool_size=2)
    try:
        gpus = await _until_node_is_schedulable(scheduler_url, agent_url, node, services)
        yield RunStack(scheduler_url, agent_url, node, pool, ledger, gpus)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*services, return_exceptions=True), timeout=60)
        await ledger.close()


async def _until_node_is_schedulable(
    scheduler_url: str, agent_url: str, node: str, services: list[asyncio.Task[None]]
) -> tuple[dict[str, Any], ...]:
    deadline = asyncio.get_running_loop().time() + READY_TIMEOUT_S
    async with httpx.AsyncClient(timeout=5) as client:
        while True:
            for service in services:
                assert not service.done(), f"a service stopped during start-up: {service.exception()!r}"
            try:
                nodes = (await client.get(f"{scheduler_url}/api/v1/nodes")).json()
                devices = (await client.get(f"{agent_url}/api/v1/devices")).json()["data"]
            except (httpx.TransportError, ValueError, KeyError):
                nodes, devices = [], []
            if any(n["name"] == node and n["gpus"] == NODE_GPUS and n["schedulable"] for n in nodes):
                return tuple(devices)
            assert asyncio.get_running_loop().time() < deadline, f"node {node} not schedulable in time"
            await asyncio.sleep(0.1)

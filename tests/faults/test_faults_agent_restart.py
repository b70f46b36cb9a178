"""Found by the fault campaign: a node agent restarted after SIGKILL must still show the allocations
placed on its node before the restart (its durable consumer only delivers what changed since).

The agent holds no database credential: it asks the scheduler, which answers from the ledger with
that node's allocations only. An agent that starts before any scheduler keeps asking until one answers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from uuid import uuid4

import httpx
import pytest
from pydantic import SecretStr
from support.scratch_database import scratch_database
from tfagent.app import build
from tfcommon.events import WorkloadRef
from tfcommon.gpu_models import GIB
from tfcommon.infra import EmbeddedNats, free_port
from tfcommon.ledger.records import GpuSpec, NodeSpec, ReservationRequest, Reserved, ShareRequest
from tfcommon.ledger.sql import SqlLedger
from tfcommon.runtime import serve
from tfcommon.settings import AgentSettings, DatabaseSettings, NatsSettings, SchedulerSettings
from tfscheduler.app import build as build_scheduler

pytestmark = pytest.mark.integration


@pytest.fixture
def database_url(postgres_server_url: str) -> Iterator[str]:
    with scratch_database(postgres_server_url, "faults_agent") as url:
        yield url


async def _allocate(database_url: str, node: str) -> str:
    ledger = SqlLedger.create(database_url)
    try:
        await ledger.upsert_pool("default")
        await ledger.upsert_node(NodeSpec(name=node, pool="default"))
        gpu = f"gpu-{uuid4()}"
        await ledger.upsert_gpu(GpuSpec(gpu, node, 0, "H100", "NVIDIA", 989_000, 80 * GIB))
        allocation_id = uuid4()
        result = await ledger.reserve(
            ReservationRequest(
                allocation_id=allocation_id,
                workload=WorkloadRef(namespace="ml", name=f"train-{node}", uid=str(uuid4())),
                pool="default",
                node=node,
                shares=(ShareRequest(gpu, 100_000, 8 * GIB),),
            ),
            commit=True,
        )
        assert isinstance(result, Reserved)
        return str(allocation_id)
    finally:
        await ledger.close()


async def test_a_restarted_agent_shows_the_allocations_the_ledger_holds_for_its_node(
    own_nats: EmbeddedNats, database_url: str
) -> None:
    node = f"node-{uuid4().hex[:10]}"
    mine = await _allocate(database_url, node)
    elsewhere = await _allocate(database_url, f"{node}-other")
    settings = AgentSettings(
        nats=NatsSettings(url=own_nats.url),
        database=DatabaseSettings(url=None),
        bind_host="127.0.0.1",
        port=free_port(),
        node_name=node,
        fake_gpus="H100:1",
        api_token=SecretStr("token"),
    )
    scheduler_settings = SchedulerSettings(
        nats=NatsSettings(url=own_nats.url),
        database=DatabaseSettings(url=database_url),
        bind_host="127.0.0.1",
        port=free_port(),
    )
    stop = asyncio.Event()
    service = asyncio.create_task(serve(build(settings), stop=stop))
    await asyncio.sleep(1.0)  # the agent asks before any scheduler runs, and asks again later
    scheduler = asyncio.create_task(serve(build_scheduler(scheduler_settings), stop=stop))
    try:
        deadline = asyncio.get_running_loop().time() + 30
        workers: list[str] = []
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{settings.port}", timeout=5) as client:
            while not workers:
                assert asyncio.get_running_loop().time() < deadline, "the agent showed no worker within 30s"
                assert not service.done(), f"the agent stopped: {service.exception()!r}"
                assert not scheduler.done(), f"the scheduler stopped: {scheduler.exception()!r}"
                try:
                    answer = await client.get("/api/v1/workers")
                    workers = [worker["worker_uid"] for worker in answer.json()["data"]]
                except httpx.TransportError:
                    workers = []
                if not workers:
                    await asyncio.sleep(0.1)
        assert workers == [mine]
        assert elsewhere not in workers
    finally:
        stop.set()
        await asyncio.gather(service, scheduler)

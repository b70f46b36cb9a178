"""What the scheduler does for node agents, which hold no database credential (real NATS and Postgres):
it answers `tf.req.scheduler.node-allocations.<node>` with that node's allocations only, and releases
through the ledger (history, outbox, `tf.evt.allocation.released`) what a `ReleaseAllocation` from a
node asks, only when the allocation is open and placed on that node."""

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
from nats.aio.msg import Msg
from pydantic import SecretStr
from scheduler_builders import GIB, a_submission, register_named_node
from scheduler_service import TOKEN, eventually, private_nats
from tfcommon import subjects
from tfcommon.bus import NatsEventBus
from tfcommon.events import AllocationReleased, ReleaseAllocation, decode
from tfcommon.infra import free_port
from tfcommon.ledger.sql import SqlLedger
from tfcommon.node_allocations import (
    NodeAllocationsReply,
    NodeAllocationsRequest,
    decode_reply,
    node_allocations_subject,
)
from tfcommon.runtime import serve
from tfcommon.settings import DatabaseSettings, NatsSettings, SchedulerSettings
from tfscheduler.app import build

pytestmark = pytest.mark.integration
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NODE = "node-a.rack-1"
OTHER_NODE = "node-b"
WITHIN_S = 15.0


@pytest.fixture
def own_nats_url(tmp_path: Path) -> Iterator[str]:
    with private_nats(tmp_path / "nats") as url:
        yield url


@contextlib.asynccontextmanager
async def scheduler_with_two_placements(
    ledger: SqlLedger, database_url: str, nats_url: str
) -> AsyncIterator[tuple[UUID, UUID]]:
    """A scheduler over one 100-TFLOPS GPU on each node, and one 60-TFLOPS workload placed on each:
    yields (the allocation on NODE, the allocation on OTHER_NODE)."""
    for node in (NODE, OTHER_NODE):
        await register_named_node(ledger, node, 1, tflops_milli=100_000)
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
            placed: dict[str, UUID] = {}
            for _ in range(2):
                body = a_submission(tflops_milli=60_000, vram_bytes=8 * GIB).model_dump(mode="json")
                response = await client.post("/api/v1/workloads", json=body, headers=AUTH)
                status: dict[str, Any] = response.json()
                assert status["state"] == "placed", status
                placed[status["node"]] = UUID(status["id"])
            yield placed[NODE], placed[OTHER_NODE]
    finally:
        stop.set()
        await asyncio.wait_for(service, timeout=30)


@pytest.fixture
async def agent_bus(own_nats_url: str) -> AsyncIterator[NatsEventBus]:
    bus = await NatsEventBus.connect(own_nats_url, service="node-agent")
    try:
        yield bus
    finally:
        await bus.close()


async def ask(bus: NatsEventBus, node: str, request: NodeAllocationsRequest) -> NodeAllocationsReply:
    answer = await bus.nc.request(
        node_allocations_subject(node), request.model_dump_json(exclude_none=True).encode(), timeout=5
    )
    return decode_reply(answer.data)


def release(node: str, allocation_id: UUID, cause: UUID | None = None) -> ReleaseAllocation:
    return ReleaseAllocation(
        event_id=uuid4(),
        occurred_at=datetime.now(UTC),
        cause=cause,
        node=node,
        allocation_id=allocation_id,
        reason="worker exited with code 0",
    )


async def handled(bus: NatsEventBus, count: int) -> None:
    """Wait until the scheduler has handled and acknowledged `count` release commands."""
    spec = subjects.SCHEDULER_RELEASE_ALLOCATIONS

    async def done() -> bool | None:
        info = await bus.js.consumer_info(spec.stream, spec.durable)
        acked = info.ack_floor.consumer_seq if info.ack_floor and info.ack_floor.consumer_seq else 0
        return True if acked >= count and not info.num_pending and not info.num_ack_pending else None

    await eventually(done, timeout_s=WITHIN_S)


async def test_a_node_is_answered_with_its_own_allocations_only(
    ledger: SqlLedger, database_url: str, own_nats_url: str, agent_bus: NatsEventBus
) -> None:
    async with scheduler_with_two_placements(ledger, database_url, own_nats_url) as (mine, theirs):
        listing = await ask(agent_bus, NODE, NodeAllocationsRequest())
        one = await ask(agent_bus, NODE, NodeAllocationsRequest(allocation_id=mine))
        foreign = await ask(agent_bus, NODE, NodeAllocationsRequest(allocation_id=theirs))
        other_listing = await ask(agent_bus, OTHER_NODE, NodeAllocationsRequest())

    assert listing.node == NODE
    assert listing.error is None
    assert [(item.allocation_id, item.node, item.state) for item in listing.allocations] == [
        (mine, NODE, "committed")
    ]
    assert listing.allocations[0].shares[0].tflops_milli == 60_000
    assert [item.allocation_id for item in one.allocations] == [mine]
    assert foreign.allocations == ()
    assert [item.allocation_id for item in other_listing.allocations] == [theirs]


async def test_a_release_from_the_node_closes_its_allocation_through_the_ledger(
    ledger: SqlLedger, database_url: str, own_nats_url: str, agent_bus: NatsEventBus
) -> None:
    released: list[AllocationReleased] = []

    async def on_released(msg: Msg) -> None:
        message = decode(msg.subject, msg.data)
        assert isinstance(message, AllocationReleased)
        released.append(message)

    await agent_bus.nc.subscribe(AllocationReleased.subject, cb=on_released)
    start_worker = uuid4()
    async with scheduler_with_two_placements(ledger, database_url, own_nats_url) as (mine, _):
        await agent_bus.publish(release(NODE, mine, cause=start_worker))

        async def announced() -> bool | None:
            return True if released else None

        await eventually(announced, timeout_s=WITHIN_S)
        await agent_bus.publish(release(NODE, mine))  # a repeat releases nothing more
        await handled(agent_bus, 2)
        record = await ledger.get_allocation(mine)
        history = await ledger.history(mine)

    assert [(event.allocation_id, event.node, event.reason) for event in released] == [
        (mine, NODE, "worker exited with code 0")
    ]
    assert record is not None
    assert (record.state, record.release_reason) == ("released", "worker exited with code 0")
    closing = [entry for entry in history if entry.kind == "released"]
    assert [entry.cause for entry in closing] == [start_worker]


async def test_a_release_naming_another_nodes_allocation_releases_nothing(
    ledger: SqlLedger, database_url: str, own_nats_url: str, agent_bus: NatsEventBus
) -> None:
    async with scheduler_with_two_placements(ledger, database_url, own_nats_url) as (mine, theirs):
        await agent_bus.publish(release(NODE, theirs))
        await agent_bus.publish(release(NODE, uuid4()))
        await handled(agent_bus, 2)
        record = await ledger.get_allocation(theirs)
        still_mine = await ledger.get_allocation(mine)

    assert record is not None
    assert record.state != "released"
    assert still_mine is not None
    assert still_mine.state != "released"

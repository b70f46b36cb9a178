"""The agent on real NATS JetStream: registration, heartbeats, usage, allocations, lost GPUs, readiness."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest
from agent_builders import allocation_created, simulated_agent
from nats.aio.msg import Msg
from support.polling import eventually as poll_until
from tfagent.agent import AgentTimers, NodeAgent
from tfcommon import subjects
from tfcommon.bus import NatsEventBus
from tfcommon.consumer import run_pull_consumer
from tfcommon.events import (
    AllocationReleased,
    GpuDisappeared,
    GpuDiscovered,
    GpuUsageReported,
    Message,
    NodeHeartbeatSent,
    NodeRegistered,
    decode,
)
from tfcommon.node_readiness import HeartbeatSeen, not_ready_nodes, record_heartbeat

pytestmark = pytest.mark.integration

FAST = AgentTimers(heartbeat_interval_s=0.2, sample_interval_s=0.2, discovery_interval_s=0.3)
DEADLINE_S = 15.0
eventually = functools.partial(poll_until, timeout_s=DEADLINE_S, every_s=0.02)


@dataclass
class Observed:
    """Every event about one node seen on the bus, with the raw headers and the time it arrived."""

    node: str
    messages: list[Message] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    heartbeats: dict[str, HeartbeatSeen] = field(default_factory=dict)

    async def on_message(self, msg: Msg) -> None:
        message = decode(msg.subject, msg.data)
        if getattr(message, "node", None) != self.node:
            return
        self.messages.append(message)
        self.headers.append(dict(msg.headers or {}))
        if isinstance(message, NodeHeartbeatSent):
            self.heartbeats = record_heartbeat(
                self.heartbeats, self.node, datetime.now(UTC), message.interval_ms
            )

    def of(self, kind: type[Message]) -> list[Message]:
        return [message for message in self.messages if isinstance(message, kind)]


@pytest.fixture(scope="module")
async def bus(nats_url: str) -> AsyncIterator[NatsEventBus]:
    connected = await NatsEventBus.connect(nats_url, service="node-agent")
    await subjects.provision(connected.js)
    try:
        yield connected
    finally:
        await connected.close()


@pytest.fixture
async def observed(bus: NatsEventBus) -> AsyncIterator[Observed]:
    seen = Observed(node=f"node-{uuid4().hex[:10]}")
    subscription = await bus.nc.subscribe(subjects.ALL_EVENTS, cb=seen.on_message)
    try:
        yield seen
    finally:
        await subscription.unsubscribe()


@dataclass
class Running:
    agent: NodeAgent
    stop: asyncio.Event
    task: asyncio.Task[None]


async def start(agent: NodeAgent, *extra: Callable[[asyncio.Event], Awaitable[None]]) -> Running:
    stop = asyncio.Event()

    async def main() -> None:
        await agent.register()
        await asyncio.gather(agent.run(stop), *(work(stop) for work in extra))

    return Running(agent, stop, asyncio.create_task(main()))


async def stop_running(running: Running) -> None:
    running.stop.set()
    await asyncio.wait_for(running.task, timeout=DEADLINE_S)


async def test_registers_then_sends_heartbeats_and_batched_usage_as_cloudevents(
    bus: NatsEventBus, observed: Observed
) -> None:
    agent, _ = simulated_agent(bus, "H100:2,L4:1", node=observed.node, timers=FAST)
    running = await start(agent)
    try:
        await eventually(
            lambda: len(observed.of(NodeHeartbeatSent)) >= 2 and len(observed.of(GpuUsageReported)) >= 2,
            "two heartbeats and two usage reports",
        )
    finally:
        await stop_running(running)

    registered = observed.messages[0]
    assert isinstance(registered, NodeRegistered)
    assert (registered.gpu_count, registered.simulated, registered.pool) == (3, True, "default")
    discovered = observed.messages[1:4]
    assert all(isinstance(m, GpuDiscovered) for m in discovered)
    assert sorted(m.model for m in discovered if isinstance(m, GpuDiscovered)) == ["H100", "H100", "L4"]
    report = observed.of(GpuUsageReported)[0]
    assert isinstance(report, GpuUsageReported)
    assert report.simulated
    assert len(report.gpus) == 3
    assert all(h["ce-source"] == "/tfpool/node-agent" and h["Nats-Msg-Id"] for h in observed.headers)


async def test_follows_allocations_and_keeps_an_allocated_gpu_that_disappears_as_unknown(
    bus: NatsEventBus, observed: Observed
) -> None:
    agent, probe = simulated_agent(bus, "H100:2", node=observed.node, timers=FAST)
    consumer = subjects.node_agent_track_allocations(observed.node)
    await subjects.provision_consumer(bus.js, consumer)

    async def track(stop: asyncio.Event) -> None:
        await run_pull_consumer(
            bus.js,
            consumer,
            agent.track_allocation,
            bus=bus,
            service="node-agent",
            stop=stop,
            fetch_timeout_s=0.2,
        )

    running = await start(agent, track)
    try:
        await eventually(lambda: agent.inventory is not None, "the first discovery")
        assert agent.inventory is not None
        held, idle = agent.inventory.gpus
        created = allocation_created(held.uuid, node=observed.node, vram_gib=24)
        await bus.publish(created)
        await eventually(lambda: agent.allocations() != (), "the allocation to reach the agent")
        await eventually(
            lambda: any(
                isinstance(m, GpuUsageReported) and any(w.memory_bytes == 24 * 1024**3 for w in m.workers)
                for m in observed.messages
            ),
            "a usage report that shows the allocation's VRAM",
        )

        probe.remove_gpu(held.uuid)
        probe.remove_gpu(idle.uuid)
        await eventually(lambda: len(observed.of(GpuDisappeared)) == 2, "both GPUs reported as disappeared")
        assert agent.inventory is not None
        assert [(gpu.uuid, gpu.phase.value) for gpu in agent.inventory.gpus] == [(held.uuid, "Unknown")]

        await bus.publish(
            AllocationReleased(
                event_id=uuid4(),
                occurred_at=datetime.now(UTC),
                allocation_id=created.allocation_id,
                workload=created.workload,
                node=observed.node,
                reason="finished",
            )
        )
        await eventually(
            lambda: agent.inventory is not None and agent.inventory.gpus == (), "the released lost GPU to go"
        )
    finally:
        await stop_running(running)


async def test_a_node_whose_heartbeats_stop_is_marked_not_ready_by_its_reader(
    bus: NatsEventBus, observed: Observed
) -> None:
    agent, _ = simulated_agent(bus, "H100:1", node=observed.node, timers=FAST)
    running = await start(agent)
    await eventually(lambda: len(observed.of(NodeHeartbeatSent)) >= 2, "heartbeats")
    assert not_ready_nodes(observed.heartbeats, datetime.now(UTC)) == ()

    await stop_running(running)

    timeout = timedelta(seconds=1)
    await eventually(
        lambda: not_ready_nodes(observed.heartbeats, datetime.now(UTC), timeout) == (observed.node,),
        "the silent node to be not ready",
    )

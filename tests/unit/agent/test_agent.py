"""The agent shell over simulated GPUs and an in-memory bus: what it publishes and when."""

from __future__ import annotations

import asyncio

from agent_fixtures import allocation_created, allocation_released, simulated_agent
from tfagent.adapters.simulated import SimulatedGpuProbe, parse_fake_gpus
from tfagent.agent import NodeAgent
from tfcommon.bus import InMemoryEventBus
from tfcommon.events import (
    DriftDetected,
    GpuDisappeared,
    GpuDiscovered,
    GpuUsageReported,
    Message,
    NodeHeartbeatSent,
    NodeRegistered,
)
from tfcommon.gpu_models import GIB


async def test_registration_announces_the_node_and_every_gpu_as_simulated() -> None:
    agent, _, bus = simulated_agent("H100:2")

    await agent.register()

    registered, *discovered = bus.messages()
    assert isinstance(registered, NodeRegistered)
    assert (registered.node, registered.gpu_count, registered.simulated) == ("node-a", 2, True)
    assert all(isinstance(m, GpuDiscovered) and m.simulated and m.model == "H100" for m in discovered)
    assert len(discovered) == 2


async def test_a_heartbeat_says_how_often_to_expect_the_next() -> None:
    agent, _, bus = simulated_agent()
    await agent.register()

    await agent.heartbeat()

    heartbeat = bus.messages()[-1]
    assert isinstance(heartbeat, NodeHeartbeatSent)
    assert (heartbeat.node, heartbeat.gpu_count, heartbeat.interval_ms) == ("node-a", 2, 5000)


async def test_one_batched_usage_report_per_round_follows_the_allocations() -> None:
    agent, _, bus = simulated_agent("H100:2")
    inventory = await agent.register()
    created = allocation_created(inventory.gpus[0].uuid, vram_gib=10)
    await agent.track_allocation(created)

    await agent.sample()

    (report,) = [m for m in bus.messages() if isinstance(m, GpuUsageReported)]
    assert report.simulated
    assert [gpu.memory_bytes for gpu in report.gpus] == [10 * GIB, 0]
    (worker,) = report.workers
    assert (worker.allocation_id, worker.memory_bytes, worker.pod_name) == (
        created.allocation_id,
        10 * GIB,
        "train-0",
    )
    assert not [m for m in bus.messages() if isinstance(m, DriftDetected)]


async def test_allocations_of_other_nodes_are_ignored_and_released_ones_forgotten() -> None:
    agent, _, _ = simulated_agent()
    inventory = await agent.register()
    mine = allocation_created(inventory.gpus[0].uuid)

    await agent.track_allocation(mine)
    await agent.track_allocation(allocation_created(inventory.gpus[1].uuid, node="node-b"))
    assert [a.allocation_id for a in agent.allocations()] == [mine.allocation_id]

    await agent.track_allocation(allocation_released(mine))
    await agent.track_allocation(allocation_released(mine))
    assert agent.allocations() == ()


async def test_a_creation_redelivered_after_its_release_does_not_bring_the_allocation_back() -> None:
    # A redelivery (its ack lost) or a republish after the duplicate window, seen in the fault campaign.
    agent, _, _ = simulated_agent()
    inventory = await agent.register()
    created = allocation_created(inventory.gpus[0].uuid)
    await agent.track_allocation(created)
    await agent.track_allocation(allocation_released(created))

    await agent.track_allocation(created)

    assert agent.allocations() == ()


async def test_an_allocated_gpu_that_disappears_is_reported_and_kept_as_unknown() -> None:
    agent, probe, bus = simulated_agent("H100:2")
    inventory = await agent.register()
    lost = inventory.gpus[0]
    await agent.track_allocation(allocation_created(lost.uuid))

    probe.remove_gpu(lost.uuid)
    change = await agent.rediscover()

    assert [gpu.uuid for gpu in change.went_missing] == [lost.uuid]
    disappeared = bus.messages()[-1]
    assert isinstance(disappeared, GpuDisappeared)
    assert disappeared.gpu_uuid == lost.uuid
    assert agent.inventory is not None
    assert [gpu.phase.value for gpu in agent.inventory.gpus] == ["Unknown", "Running"]


class FailingPublishes(InMemoryEventBus):
    """An in-memory bus whose first `failures` publishes fail, as while NATS restarts."""

    def __init__(self, failures: int) -> None:
        super().__init__("node-agent")
        self.failures = failures

    async def publish(self, event: Message) -> None:
        if self.failures:
            self.failures -= 1
            raise TimeoutError("nats: timeout")
        await super().publish(event)


async def test_a_registration_that_fails_while_nats_restarts_is_tried_again_not_fatal() -> None:
    bus = FailingPublishes(failures=2)
    probe = SimulatedGpuProbe("node-a", parse_fake_gpus("H100:2"))
    agent = NodeAgent(node="node-a", pool="default", probe=probe, owners=probe, bus=bus)

    inventory = await agent.register_until_done(asyncio.Event(), retry_s=0.01)

    assert inventory is not None
    assert len(inventory.gpus) == 2
    registered = [m for m in bus.messages() if isinstance(m, NodeRegistered)]
    assert [m.node for m in registered] == ["node-a"]
    assert len([m for m in bus.messages() if isinstance(m, GpuDiscovered)]) == 2


async def test_a_registration_still_failing_when_the_agent_stops_gives_up_quietly() -> None:
    bus = FailingPublishes(failures=1_000)
    probe = SimulatedGpuProbe("node-a", parse_fake_gpus("H100:1"))
    agent = NodeAgent(node="node-a", pool="default", probe=probe, owners=probe, bus=bus)
    stopping = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, stopping.set)

    assert await agent.register_until_done(stopping, retry_s=0.01) is None
    assert bus.messages() == []

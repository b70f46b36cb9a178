"""Builders for the agent's integration tests: an agent over simulated GPUs, and allocation events."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import uuid4

from tfagent.adapters.simulated import SimulatedGpuProbe, parse_fake_gpus
from tfagent.agent import AgentTimers, NodeAgent
from tfcommon.bus import EventBus
from tfcommon.events import AllocationCreated, GpuShare, WorkloadRef
from tfcommon.gpu_models import GIB


def simulated_agent(
    bus: EventBus, spec: str = "H100:2", node: str = "node-a", timers: AgentTimers | None = None
) -> tuple[NodeAgent, SimulatedGpuProbe]:
    holder: list[NodeAgent] = []
    probe = SimulatedGpuProbe(node, parse_fake_gpus(spec), allocations=lambda: holder[0].allocations())
    agent = NodeAgent(node=node, pool="default", probe=probe, owners=probe, bus=bus, timers=timers)
    holder.append(agent)
    return agent, probe


def allocation_created(gpu_uuid: str, *, node: str = "node-a", vram_gib: int = 10) -> AllocationCreated:
    return AllocationCreated(
        event_id=uuid4(),
        occurred_at=datetime.now(UTC),
        allocation_id=uuid4(),
        workload=WorkloadRef(namespace="ml", name="train-0", uid=str(uuid4()), workload="train"),
        pool="default",
        node=node,
        shares=(GpuShare(gpu_uuid=gpu_uuid, tflops_milli=100_000, vram_bytes=vram_gib * GIB),),
        qos="medium",
        isolation="soft",
    )

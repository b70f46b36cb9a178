"""Builders for a `NodeAgent` over simulated GPUs and an in-memory bus, and allocation events for it."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID, uuid4

from tfagent.adapters.simulated import SimulatedGpuProbe, parse_fake_gpus
from tfagent.agent import NodeAgent
from tfcommon.bus import InMemoryEventBus
from tfcommon.events import AllocationCreated, AllocationReleased, GpuShare, WorkloadRef
from tfcommon.gpu_models import GIB


def simulated_agent(
    spec: str = "H100:2", node: str = "node-a"
) -> tuple[NodeAgent, SimulatedGpuProbe, InMemoryEventBus]:
    bus = InMemoryEventBus("node-agent")
    holder: list[NodeAgent] = []
    probe = SimulatedGpuProbe(node, parse_fake_gpus(spec), allocations=lambda: holder[0].allocations())
    agent = NodeAgent(node=node, pool="default", probe=probe, owners=probe, bus=bus)
    holder.append(agent)
    return agent, probe, bus


def allocation_created(
    gpu_uuid: str,
    *,
    node: str = "node-a",
    tflops_milli: int = 100_000,
    vram_gib: int = 10,
    name: str = "train-0",
    allocation_id: UUID | None = None,
) -> AllocationCreated:
    return AllocationCreated(
        event_id=uuid4(),
        occurred_at=datetime.now(UTC),
        allocation_id=allocation_id or uuid4(),
        workload=WorkloadRef(namespace="ml", name=name, uid=str(uuid4()), workload="train"),
        pool="default",
        node=node,
        shares=(GpuShare(gpu_uuid=gpu_uuid, tflops_milli=tflops_milli, vram_bytes=vram_gib * GIB),),
        qos="medium",
        isolation="soft",
    )


def allocation_released(created: AllocationCreated) -> AllocationReleased:
    return AllocationReleased(
        event_id=uuid4(),
        occurred_at=datetime.now(UTC),
        allocation_id=created.allocation_id,
        workload=created.workload,
        node=created.node,
        reason="finished",
    )

"""Composition root of the node-agent service (GPU discovery, usage reports, hypervisor API).

Only wiring lives here: `compose` plugs routers, consumers and tasks into the shared runtime
(`tfcommon.runtime`); decisions live in `tfagent.core`. Nothing is built at import time.
"""

from __future__ import annotations

import socket

from tfcommon import subjects
from tfcommon.consumer import run_pull_consumer
from tfcommon.gpu_models import GpuModelSpec
from tfcommon.runtime import Components, ServiceContext, ServiceSpec, StartupError, run_service
from tfcommon.settings import AgentSettings

from tfagent.adapters.nvml import NvmlGpuProbe, NvmlUnavailableError, load_pynvml
from tfagent.adapters.process_owners import HostProcessOwners
from tfagent.adapters.simulated import FakeGpuSpecError, SimulatedGpuProbe, parse_fake_gpus
from tfagent.agent import AgentTimers, NodeAgent
from tfagent.api import build_router
from tfagent.core.inventory import ModelCatalog
from tfagent.ports import GpuProbe, ProcessOwners

SERVICE = "node-agent"


def node_name(settings: AgentSettings) -> str:
    return (settings.node_name or socket.gethostname()).lower()


def model_catalog(settings: AgentSettings) -> ModelCatalog:
    overrides = tuple(
        GpuModelSpec(model.name, model.fp16_tflops_milli, model.vram_bytes, model.source, model.nvml_names)
        for model in settings.gpu_models
    )
    return ModelCatalog(overrides=overrides, fallback_tflops_milli=settings.fallback_tflops_milli)


async def compose(context: ServiceContext[AgentSettings]) -> Components:
    settings = context.settings
    node = node_name(settings)
    agent_holder: list[NodeAgent] = []
    probe: GpuProbe
    owners: ProcessOwners
    try:
        if settings.fake_gpus:
            simulated = SimulatedGpuProbe(
                node,
                parse_fake_gpus(settings.fake_gpus),
                allocations=lambda: agent_holder[0].allocations(),
                catalog=model_catalog(settings),
            )
            probe, owners = simulated, simulated
        else:
            probe, owners = NvmlGpuProbe(load_pynvml(), node, model_catalog(settings)), HostProcessOwners()
    except (FakeGpuSpecError, NvmlUnavailableError) as error:
        raise StartupError(str(error)) from error
    context.cleanup.callback(probe.close)
    agent = NodeAgent(
        node=node,
        pool=settings.pool,
        probe=probe,
        owners=owners,
        bus=context.bus,
        timers=AgentTimers(
            heartbeat_interval_s=settings.heartbeat_interval_s,
            sample_interval_s=settings.sample_interval_s,
            discovery_interval_s=settings.discovery_interval_s,
        ),
        agent_url=f"http://{node}:{settings.port}",
    )
    agent_holder.append(agent)
    allocations = subjects.node_agent_track_allocations(node)
    await subjects.provision_consumer(context.bus.js, allocations)

    async def run_agent() -> None:
        await agent.register()
        await agent.run(context.stopping)

    async def track_allocations() -> None:
        await run_pull_consumer(
            context.bus.js,
            allocations,
            agent.track_allocation,
            bus=context.bus,
            service=SERVICE,
            stop=context.stopping,
        )

    return Components(
        routers=[build_router(agent, settings.api_token)],
        tasks={"agent": run_agent, "track-allocations": track_allocations},
    )


def build(settings: AgentSettings) -> ServiceSpec[AgentSettings]:
    """The node-agent service as the runtime runs it."""
    return ServiceSpec(name=SERVICE, settings=settings, port=settings.port, compose=compose)


def main() -> int:
    return run_service(build(AgentSettings()))

"""Composition root of the node-agent service (GPU discovery, usage reports, hypervisor API).

Only wiring lives here: `compose` plugs routers, consumers and tasks into the shared runtime
(`tfcommon.runtime`); decisions live in `tfagent.core`. Nothing is built at import time.
The agent runs without the ledger (`needs_ledger=False`: no database credential on a GPU node); what it
needs from it goes through the scheduler over NATS (`tfagent.scheduler_ledger`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from kubernetes.config import ConfigException
from tfcommon import subjects
from tfcommon.cluster.kubernetes import KubernetesCluster
from tfcommon.cluster.model import Pod
from tfcommon.events import Message
from tfcommon.gpu_models import GpuModelSpec
from tfcommon.runtime import (
    BackgroundTask,
    Components,
    ServiceContext,
    ServiceSpec,
    StartupError,
    run_service,
)
from tfcommon.settings import AgentSettings

from tfagent.adapters.nvml import NvmlGpuProbe, NvmlUnavailableError, load_pynvml
from tfagent.adapters.process_owners import HostProcessOwners
from tfagent.adapters.simulated import FakeGpuSpecError, SimulatedGpuProbe, parse_fake_gpus
from tfagent.adapters.worker_journal import WorkerJournal
from tfagent.agent import AgentTimers, NodeAgent
from tfagent.api import build_router
from tfagent.commands import NodeCommands
from tfagent.core.deviceplugin import LimiterLibrary
from tfagent.core.inventory import ModelCatalog
from tfagent.deviceplugin.server import DevicePlugins, serve_device_plugins
from tfagent.kubernetes_status import KubernetesStatus
from tfagent.ports import GpuProbe, ProcessOwners
from tfagent.providers import provider_model_table
from tfagent.scheduler_ledger import LedgerUnavailableError, SchedulerLedger
from tfagent.workers import WorkerRunner, build_workers_router

SERVICE = "node-agent"
RESTORE_FIRST_RETRY_S = 0.5
RESTORE_RETRY_MAX_S = 5.0
log = logging.getLogger("tfagent")


def node_name(settings: AgentSettings) -> str:
    return (settings.node_name or socket.gethostname()).lower()


def model_catalog(settings: AgentSettings, providers: tuple[GpuModelSpec, ...] = ()) -> ModelCatalog:
    """The model table: `TF_GPU_MODELS`, then the cluster's ProviderConfig models, then the built-ins."""
    overrides = tuple(
        GpuModelSpec(model.name, model.fp16_tflops_milli, model.vram_bytes, model.source, model.nvml_names)
        for model in settings.gpu_models
    )
    return ModelCatalog(
        overrides=overrides, fallback_tflops_milli=settings.fallback_tflops_milli, providers=providers
    )


async def compose(context: ServiceContext[AgentSettings]) -> Components:
    settings = context.settings
    node = node_name(settings)
    agent_holder: list[NodeAgent] = []
    probe: GpuProbe
    owners: ProcessOwners
    custom_resources = kubernetes_status(context, node) if settings.agent_kubernetes else None
    providers = await provider_model_table(custom_resources.cluster) if custom_resources is not None else ()
    try:
        if settings.fake_gpus:
            simulated = SimulatedGpuProbe(
                node,
                parse_fake_gpus(settings.fake_gpus),
                allocations=lambda: agent_holder[0].allocations(),
                catalog=model_catalog(settings, providers),
            )
            probe, owners = simulated, simulated
        else:
            probe, owners = (
                NvmlGpuProbe(load_pynvml(), node, model_catalog(settings, providers)),
                HostProcessOwners(),
            )
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
        on_inventory=None if custom_resources is None else custom_resources.notify,
    )
    agent_holder.append(agent)
    ledger = SchedulerLedger(context.nats, node)
    allocations = subjects.node_agent_track_allocations(node)
    await subjects.provision_consumer(context.nats.js, allocations)
    commands_consumer = subjects.node_agent_run_commands(node)
    await subjects.provision_consumer(context.nats.js, commands_consumer)

    async def run_agent() -> None:
        if await agent.register_until_done(context.stopping) is not None:
            await agent.run(context.stopping)

    runner = worker_runner(settings, node, agent, owners)
    context.cleanup.push_async_callback(runner.close)

    async def track_allocation(message: Message) -> Sequence[Message]:
        runner.stop_if_released(message)
        return await agent.track_allocation(message)

    commands = NodeCommands(node, agent, runner, ledger)

    async def supervise_workers() -> None:
        await runner.recover(commands.release_in_ledger, context.stopping)
        await context.stopping.wait()
        # Before the HTTP server waits for open streams: a worker's stream ends when its command does.
        await runner.close()

    tasks: dict[str, BackgroundTask] = {
        "restore-allocations": partial(restore_allocations, agent, ledger, context.stopping),
        "agent": run_agent,
        "workers": supervise_workers,
    }
    if custom_resources is not None:
        tasks["kubernetes-status"] = partial(custom_resources.run, context.stopping)
    if settings.device_plugin_dir is not None:
        tasks["device-plugins"] = device_plugin_task(context, node, agent, settings.device_plugin_dir)
    routers = [
        build_router(agent, settings.api_token, processes=runner.describe),
        build_workers_router(runner, settings.api_token),
    ]
    return Components(
        routers=routers,
        handlers={allocations: track_allocation, commands_consumer: commands.handle},
        tasks=tasks,
    )


async def restore_allocations(agent: NodeAgent, ledger: SchedulerLedger, stopping: asyncio.Event) -> None:
    """Start from this node's open allocations, asked of the scheduler (after a restart the durable
    consumer delivers only what changed since); asked again, backing off, until a scheduler answers."""
    delay = RESTORE_FIRST_RETRY_S
    warned = False
    while not stopping.is_set():
        try:
            restored = await ledger.open_allocations()
        except LedgerUnavailableError as error:
            if not warned:
                log.warning(
                    "cannot read this node's open allocations yet; asking again until the scheduler answers",
                    extra={"event": "agent.restore", "outcome": "retry", "error": str(error)},
                )
                warned = True
        else:
            agent.restore(restored)
            log.info(
                "restored %d open allocation(s) of this node from the scheduler",
                len(restored),
                extra={"event": "agent.restore", "outcome": "restored"},
            )
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), timeout=delay)
        delay = min(delay * 2, RESTORE_RETRY_MAX_S)
    await stopping.wait()


def worker_runner(
    settings: AgentSettings, node: str, agent: NodeAgent, owners: ProcessOwners
) -> WorkerRunner:
    """The `tfctl run` workers of this node; their pids are attributed to allocations on a real host."""

    def gpu_capacity_milli() -> dict[str, int]:
        inventory = agent.inventory
        return {} if inventory is None else {gpu.uuid: gpu.tflops_milli for gpu in inventory.gpus}

    registry = owners if isinstance(owners, HostProcessOwners) else None
    return WorkerRunner(
        node,
        settings.api_token,
        gpu_capacity_milli,
        limiter_library=settings.limiter_library,
        on_started=None if registry is None else registry.register_pid,
        on_ended=None if registry is None else registry.forget_pid,
        journal=WorkerJournal(settings.agent_state_dir.expanduser() / "workers" / node),
    )


def kubernetes_status(context: ServiceContext[AgentSettings], node: str) -> KubernetesStatus:
    """This node's GPUNode and GPU objects in the Kubernetes API (`TF_AGENT_KUBERNETES=true`)."""
    settings = context.settings
    try:
        cluster = KubernetesCluster.from_environment(kubeconfig=_path(settings.agent_kubeconfig))
    except (ConfigException, OSError) as error:
        raise StartupError(
            f"TF_AGENT_KUBERNETES=true but no Kubernetes API is configured ({error}); run in a pod with a "
            "service account, set TF_AGENT_KUBECONFIG, or set TF_AGENT_KUBERNETES=false"
        ) from error
    context.cleanup.callback(cluster.close)
    return KubernetesStatus(cluster, node=node, pool=settings.pool)


def _path(path: Path | None) -> str | None:
    return None if path is None else str(path)


def device_plugin_task(
    context: ServiceContext[AgentSettings], node: str, agent: NodeAgent, plugin_dir: Path
) -> BackgroundTask:
    """The kubelet device plugins, answering `Allocate` from this node's pods in the Kubernetes API."""
    settings = context.settings
    cluster = KubernetesCluster.from_environment(kubeconfig=_path(settings.agent_kubeconfig))
    context.cleanup.callback(cluster.close)

    def gpu_capacity_milli() -> dict[str, int]:
        inventory = agent.inventory
        return {} if inventory is None else {gpu.uuid: gpu.tflops_milli for gpu in inventory.gpus}

    async def pods_on_node() -> list[Pod]:
        return await cluster.list_pods(node_name=node)

    limiter = None if settings.limiter_library is None else LimiterLibrary(host_path=settings.limiter_library)
    plugins = DevicePlugins(plugin_dir, pods_on_node, gpu_capacity_milli, limiter)
    return lambda: serve_device_plugins(plugins, context.stopping)


def build(settings: AgentSettings) -> ServiceSpec[AgentSettings]:
    """The node-agent service as the runtime runs it."""
    return ServiceSpec(
        name=SERVICE, settings=settings, port=settings.port, compose=compose, needs_ledger=False
    )


def main() -> int:
    return run_service(build(AgentSettings()))

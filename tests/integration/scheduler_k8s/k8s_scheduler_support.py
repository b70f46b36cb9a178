"""Builders and a running Kubernetes-mode scheduler for the tests: an API server over HTTP (kmock with the
stateful reactions of `cluster_apiserver`), GPU nodes in the ledger, webhook-annotated pods, polling."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import uuid4

import kmock
from cluster_apiserver import ApiServerState, install
from tfagent.core.inventory import GpuDevice, NodeInventory
from tfagent.kubernetes_status import KubernetesStatus
from tfcommon.bus import NatsEventBus
from tfcommon.cluster.kubernetes import KubernetesCluster
from tfcommon.ledger.records import GpuSpec, NodeSpec
from tfcommon.ledger.sql import SqlLedger
from tfcommon.settings import SchedulerKubernetesSettings
from tfscheduler.engine import Scheduler
from tfscheduler.kubernetes_mode import KubernetesMode, wire_kubernetes
from tfscheduler.status_writer import StatusWriter

GIB = 1024**3
SCHEDULER = "tensor-fusion-scheduler"
PODS = "/v1/pods"
LONG = timedelta(hours=1)


async def eventually(check: Callable[[], object], timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what} not met within {timeout_s}s"
        await asyncio.sleep(0.02)


async def eventually_async(
    check: Callable[[], Any], timeout_s: float = 10.0, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, f"{what} not met within {timeout_s}s"
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def api_server() -> AsyncIterator[tuple[ApiServerState, kmock.KubernetesScaffold, str]]:
    state = ApiServerState()
    async with kmock.KubernetesScaffold() as scaffold, kmock.Server(scaffold) as server:
        yield state, scaffold, str(server.url).rstrip("/")
        state.stopping = True


async def register_gpus(
    ledger: SqlLedger,
    node: str,
    gpus: int,
    *,
    pool: str = "default",
    tflops_milli: int = 100_000,
    vram_bytes: int = 80 * GIB,
) -> list[str]:
    await ledger.upsert_node(NodeSpec(name=node, pool=pool))
    await ledger.record_heartbeat(node)
    uuids = []
    for index in range(gpus):
        uuid = f"gpu-{uuid4()}"
        await ledger.upsert_gpu(
            GpuSpec(
                uuid=uuid,
                node=node,
                index=index,
                model="H100",
                vendor="NVIDIA",
                capacity_tflops_milli=tflops_milli,
                capacity_vram_bytes=vram_bytes,
            )
        )
        uuids.append(uuid)
    return uuids


async def write_agent_objects(cluster: KubernetesCluster, ledger: SqlLedger, node: str) -> None:
    """What the node agent does in Kubernetes mode (`TF_AGENT_KUBERNETES=true`): create the node's GPUNode
    and GPU objects with the status it owns, here from the GPUs `register_gpus` put in the ledger."""
    record = next(n for n in await ledger.list_nodes() if n.name == node)
    gpus = tuple(
        GpuDevice(
            uuid=gpu.uuid.lower(),
            index=gpu.index,
            model=gpu.model,
            product_name=f"{gpu.vendor} {gpu.model}",
            tflops_milli=gpu.capacity_tflops_milli,
            vram_bytes=gpu.capacity_vram_bytes,
            pci_bus_id=f"00000000:{gpu.index:02x}:00.0",
            numa_node=gpu.numa_node,
            nvlink_peers=(),
            mig_enabled=False,
            capacity_source="test",
        )
        for gpu in await ledger.list_gpus()
        if gpu.node == node
    )
    inventory = NodeInventory(node=node, driver_version="test", cuda_version="test", gpus=gpus)
    await KubernetesStatus(cluster, node=node, pool=record.pool).sync(inventory)


def gpu_pod(
    name: str,
    *,
    tflops: str = "10",
    vram: str = "8Gi",
    gpu_count: int = 1,
    qos: str = "medium",
    priority: int | None = None,
    node: str | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    phase: str = "Pending",
) -> dict[str, Any]:
    """A pod as the admission webhook leaves it (annotations of reference section 1.3)."""
    spec: dict[str, Any] = {
        "schedulerName": SCHEDULER,
        "containers": [{"name": "main", "image": "cuda"}],
    }
    if priority is not None:
        spec["priority"] = priority
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "labels": {"tensor-fusion.ai/component": "worker", **(labels or {})},
            "annotations": {
                "tensor-fusion.ai/gpupool": "default",
                "tensor-fusion.ai/tflops-request": tflops,
                "tensor-fusion.ai/tflops-limit": tflops,
                "tensor-fusion.ai/vram-request": vram,
                "tensor-fusion.ai/vram-limit": vram,
                "tensor-fusion.ai/gpu-count": str(gpu_count),
                "tensor-fusion.ai/qos": qos,
                "tensor-fusion.ai/isolation": "soft",
                "tensor-fusion.ai/inject-container": "main",
                "tensor-fusion.ai/container-gpu-count": f'{{"main":{gpu_count}}}',
                **(annotations or {}),
            },
        },
        "spec": spec,
        "status": {"phase": phase},
    }


@dataclass
class Running:
    """A Kubernetes-mode scheduler process (engine, pod loop, status writer) running until `stop()`."""

    state: ApiServerState
    cluster: KubernetesCluster
    scheduler: Scheduler
    mode: KubernetesMode
    status: StatusWriter
    stopping: asyncio.Event
    tasks: list[asyncio.Task[Any]]

    def pod(self, name: str, namespace: str = "team-a") -> dict[str, Any] | None:
        return self.state.objects.get((PODS, namespace, name))

    def put(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return self.state.put(PODS, manifest)

    def delete(self, name: str, namespace: str = "team-a") -> None:
        self.state.delete(PODS, namespace, name)

    async def stop(self) -> None:
        self.stopping.set()
        await asyncio.gather(*self.tasks)
        self.cluster.close()


async def start_scheduler(state: ApiServerState, url: str, ledger: SqlLedger, bus: NatsEventBus) -> Running:
    """The scheduler as `tfctl serve scheduler` wires it with TF_SCHEDULER_MODE=kubernetes (fast timers)."""
    cluster = KubernetesCluster.for_url(url, watch_timeout_s=5)
    scheduler = Scheduler(ledger, bus, heartbeat_timeout=LONG)
    await scheduler.start()
    settings = SchedulerKubernetesSettings(
        mode="kubernetes", status_debounce_s=0.1, status_poll_interval_s=0.3, pending_retry_interval_s=0.5
    )
    wiring = wire_kubernetes(scheduler, settings, cluster=cluster)
    stopping = asyncio.Event()
    tasks = [asyncio.create_task(start()) for start in wiring.tasks(stopping).values()]
    return Running(state, cluster, scheduler, wiring.mode, wiring.status, stopping, tasks)


def install_once(scaffold: kmock.KubernetesScaffold, state: ApiServerState) -> None:
    if not state.installed:
        install(scaffold, state)
        state.installed = True

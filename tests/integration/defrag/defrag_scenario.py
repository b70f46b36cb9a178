"""A pool with a lightly used source node and a fuller target, in the ledger and a cluster, plus a
stand-in scheduler that places replacements (it follows the pod watch; no polling sleeps)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import sqlalchemy as sa
from tfcommon.bus import InMemoryEventBus
from tfcommon.cluster import Cluster
from tfcommon.cluster.memory import InMemoryCluster
from tfcommon.events import Message, PodEvicted, WorkloadRef
from tfcommon.ledger import tables
from tfcommon.ledger.records import GpuSpec, NodeSpec, ReservationRequest, ShareRequest
from tfcommon.ledger.sql import SqlLedger
from tfdefrag.campaign import CampaignDeps, CampaignExecutor, ExecutorSettings
from tfdefrag.core.config import DefragConfig
from tfdefrag.store import CampaignStore
from tfscheduler.core.view import node_block_reason

GIB = 1 << 30
TFLOPS = 1_000_000
VRAM = 80 * GIB
SCHEDULER = "tensor-fusion-scheduler"
LONG_AGO = "2026-01-01T00:00:00Z"
CONFIG = DefragConfig(enabled=True, timezone="UTC")


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Scenario:
    pool: str
    namespace: str
    source: str
    target: str
    workers: tuple[str, ...]
    ledger: SqlLedger
    cluster: Cluster
    store: CampaignStore
    bus: InMemoryEventBus = field(default_factory=InMemoryEventBus)
    seed_put_budget: object = None

    def gpu(self, node: str, index: int) -> str:
        return f"gpu-{node}-{index}"

    def executor(
        self,
        *,
        replacement_timeout_s: float = 10.0,
        cluster: Cluster | None = None,
        publish: Callable[[Message], Awaitable[None]] | None = None,
    ) -> CampaignExecutor:
        return CampaignExecutor(
            CampaignDeps(
                cluster=cluster or self.cluster,
                ledger=self.ledger,
                store=self.store,
                publish=publish or self.bus.publish,
                clock=utc_now,
                settings=ExecutorSettings(
                    replacement_timeout=timedelta(seconds=replacement_timeout_s), poll_interval_s=0.02
                ),
            )
        )

    async def events(self) -> list[str]:
        """The subjects of what the campaign announced, in the order it happened: what it published and
        the `tf.evt.pod.evicted` it wrote to the ledger outbox with each eviction (for the relay)."""
        announced = [message.decoded() for message in self.bus.stored]
        outbox = tables.outbox.c
        async with self.ledger.engine.connect() as connection:
            rows = await connection.execute(
                sa.select(outbox.payload).where(
                    outbox.subject == PodEvicted.subject, outbox.payload["pool"].astext == self.pool
                )
            )
            announced += [PodEvicted.model_validate(payload) for (payload,) in rows]
        return [event.subject for event in sorted(announced, key=lambda event: event.occurred_at)]


def node_manifest(name: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "creationTimestamp": LONG_AGO, "labels": {}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def pod_manifest(namespace: str, name: str, node: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": str(uuid4()),
            "labels": {"app": "serve"},
            "creationTimestamp": LONG_AGO,
            "ownerReferences": [
                {"kind": "ReplicaSet", "name": f"rs-{name}", "uid": f"rs-{name}", "controller": True}
            ],
        },
        "spec": {"nodeName": node, "schedulerName": SCHEDULER, "containers": [{"name": "main"}]},
        "status": {"phase": "Running"},
    }


def budget_manifest(namespace: str, allowed: int) -> dict[str, object]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "serve", "namespace": namespace},
        "spec": {"selector": {"matchLabels": {"app": "serve"}}},
        "status": {"disruptionsAllowed": allowed, "currentHealthy": 3, "desiredHealthy": 2},
    }


async def reserve(
    ledger: SqlLedger, pool: str, namespace: str, name: str, node: str, gpu: str, share: int
) -> None:
    await ledger.reserve(
        ReservationRequest(
            allocation_id=uuid4(),
            workload=WorkloadRef(namespace=namespace, name=name, uid=str(uuid4())),
            pool=pool,
            node=node,
            shares=(
                ShareRequest(
                    gpu_uuid=gpu, tflops_milli=share * TFLOPS // 1000, vram_bytes=share * VRAM // 1000
                ),
            ),
        )
    )


async def register_node(ledger: SqlLedger, pool: str, node: str) -> None:
    await ledger.upsert_node(
        NodeSpec(name=node, pool=pool, cpu_allocatable_milli=64_000, memory_allocatable_bytes=256 * GIB)
    )
    for index in range(4):
        await ledger.upsert_gpu(
            GpuSpec(
                uuid=f"gpu-{node}-{index}",
                node=node,
                index=index,
                model="H100",
                vendor="NVIDIA",
                capacity_tflops_milli=TFLOPS,
                capacity_vram_bytes=VRAM,
            )
        )


async def build_scenario(
    ledger: SqlLedger,
    cluster: Cluster,
    put: object,
    *,
    workers: tuple[str, ...] = ("w1", "w2"),
    budget_allowed: int = 5,
) -> Scenario:
    """Source: `workers` (250/1000 of GPU 0 each; 1/4 GPUs in use). Target: 3/4 GPUs at 750/1000."""
    tag = uuid4().hex[:8]
    pool, namespace, source, target = f"pool-{tag}", f"ml-{tag}", f"src-{tag}", f"dst-{tag}"
    for node in (source, target):
        await register_node(ledger, pool, node)
        put.put_node(node_manifest(node))  # type: ignore[attr-defined]
    for worker in workers:
        await reserve(ledger, pool, namespace, worker, source, f"gpu-{source}-0", 250)
        put.put_pod(pod_manifest(namespace, worker, source))  # type: ignore[attr-defined]
    for index in range(3):
        name = f"big-{index}"
        await reserve(ledger, pool, namespace, name, target, f"gpu-{target}-{index}", 750)
        put.put_pod(pod_manifest(namespace, name, target))  # type: ignore[attr-defined]
    put.put_budget(budget_manifest(namespace, budget_allowed))  # type: ignore[attr-defined]
    return Scenario(pool, namespace, source, target, workers, ledger, cluster, CampaignStore(ledger.engine))


class LocalSeed:
    """Seeds an in-memory or local cluster with the same calls as the API-server test harness."""

    def __init__(self, cluster: InMemoryCluster) -> None:
        self.cluster = cluster

    def put_node(self, manifest: dict[str, object]) -> None:
        self.cluster.put_node(manifest)

    def put_pod(self, manifest: dict[str, object]) -> None:
        self.cluster.put_pod(manifest)

    def put_budget(self, manifest: dict[str, object]) -> None:
        self.cluster.put_disruption_budget(manifest)


@dataclass
class StandInScheduler:
    """Binds each new pending pod of the namespace to the target and moves its ledger allocation there.
    `pending_peak` is the most replacements ever pending at once; `restore_budget` plays the
    disruption controller (the budget allows evictions again once the replacement runs),
    `budget_restored_after_s` after the binding, as kube-controller-manager does once the replacement
    is Ready and counted."""

    scenario: Scenario
    put: object
    restore_budget: bool = True
    budget_restored_after_s: float = 0.0
    recreate: bool = False
    pending_peak: int = 0
    placed: list[str] = field(default_factory=list)
    source_refusals: list[str | None] = field(default_factory=list)

    async def run(self) -> None:
        scenario = self.scenario
        watch = scenario.cluster.watch_pods(SCHEDULER)
        try:
            async for event in watch:
                pod = event.pod
                if pod.namespace != scenario.namespace:
                    continue
                if event.type.value == "DELETED":
                    if self.recreate:  # play the ReplicaSet controller, as a real cluster would
                        replacement = pod_manifest(pod.namespace, f"{pod.name}-r", "")
                        replacement["spec"] = {"schedulerName": SCHEDULER, "containers": [{"name": "main"}]}
                        replacement["status"] = {"phase": "Pending"}
                        replacement["metadata"]["ownerReferences"] = [  # type: ignore[index]
                            {
                                "kind": "ReplicaSet",
                                "name": f"rs-{pod.name}",
                                "uid": f"rs-{pod.name}",
                                "controller": True,
                            }
                        ]
                        self.put.put_pod(replacement)  # type: ignore[attr-defined]
                    continue
                if pod.node_name:
                    continue
                pending = [
                    p for p in await scenario.cluster.list_pods(namespace=pod.namespace) if not p.node_name
                ]
                self.pending_peak = max(self.pending_peak, len(pending))
                [source] = [n for n in await scenario.ledger.list_nodes() if n.name == scenario.source]
                self.source_refusals.append(node_block_reason(source, utc_now()))
                for allocation in await scenario.ledger.active_allocations():
                    if (
                        allocation.workload.namespace == pod.namespace
                        and allocation.workload.name == pod.name.removesuffix("-r")
                    ):
                        await scenario.ledger.release(allocation.allocation_id, "pod-deleted")
                await reserve(
                    scenario.ledger,
                    scenario.pool,
                    pod.namespace,
                    pod.name,
                    scenario.target,
                    scenario.gpu(scenario.target, 3),
                    250,
                )
                await scenario.cluster.bind_pod(pod.namespace, pod.name, scenario.target)
                self.placed.append(pod.name)
                if self.restore_budget:
                    restored = budget_manifest(pod.namespace, 5)
                    asyncio.get_running_loop().call_later(
                        self.budget_restored_after_s,
                        self.put.put_budget,  # type: ignore[attr-defined]
                        restored,
                    )
        finally:
            await watch.aclose()


@contextlib.asynccontextmanager
async def running(scheduler: StandInScheduler) -> AsyncIterator[StandInScheduler]:
    task = asyncio.create_task(scheduler.run())
    try:
        yield scheduler
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

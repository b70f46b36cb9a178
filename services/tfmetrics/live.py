"""The metrics service's live view: the latest ledger snapshot and the agents' latest usage samples.

`LiveView.refresh()` reads the ledger (read-only) into a `ClusterSnapshot`, nodes with the operator's
flags (cordon, `tensor-fusion.ai/do-not-disrupt`); the usage consumer calls `record_usage`. Usage
samples older than three of their reporting intervals are dropped, so a node that stopped reporting
stops showing usage. Nothing here is needed for correctness after a restart: the
ledger is re-read and agents report again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from tfcommon.events import GpuUsageReported
from tfcommon.ledger.port import Ledger

from tfmetrics.core.series import (
    ClusterSnapshot,
    GpuState,
    GpuUsageSample,
    NodeState,
    WorkerShare,
    WorkerUsageSample,
)

STALE_AFTER_INTERVALS = 3
DO_NOT_DISRUPT_LABEL = "tensor-fusion.ai/do-not-disrupt"
"""The operator's node label (`tfctl label node`) that keeps the defrag planner off the node."""
Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class _NodeUsage:
    received_at: datetime
    valid_for: timedelta
    gpus: tuple[GpuUsageSample, ...]
    workers: tuple[WorkerUsageSample, ...]


@dataclass
class LiveView:
    """What the metrics endpoint and the dashboard show; refreshed by a background task."""

    ledger: Ledger
    clock: Clock = utc_now
    snapshot: ClusterSnapshot | None = None
    last_error: str | None = None
    _usage: dict[str, _NodeUsage] = field(default_factory=dict)

    def record_usage(self, event: GpuUsageReported) -> None:
        """Keep the node's latest samples (an older report arriving late is ignored)."""
        current = self._usage.get(event.node)
        if current is not None and current.received_at > event.sampled_at:
            return
        self._usage[event.node] = _NodeUsage(
            received_at=event.sampled_at,
            valid_for=timedelta(milliseconds=event.interval_ms * STALE_AFTER_INTERVALS),
            gpus=tuple(
                GpuUsageSample(
                    uuid=gpu.uuid,
                    node=event.node,
                    pool=event.pool,
                    compute_tflops_milli=gpu.compute_tflops_milli,
                    compute_percentage=gpu.compute_percentage,
                    memory_bytes=gpu.memory_bytes,
                    memory_percentage=gpu.memory_percentage,
                    temperature=gpu.temperature,
                    power_usage=gpu.power_usage,
                )
                for gpu in event.gpus
            ),
            workers=tuple(
                WorkerUsageSample(
                    uuid=worker.uuid,
                    node=event.node,
                    pool=event.pool,
                    namespace=worker.namespace,
                    pod=worker.pod_name,
                    workload=worker.workload,
                    worker=worker.worker,
                    compute_tflops_milli=worker.compute_tflops_milli,
                    compute_percentage=worker.compute_percentage,
                    memory_bytes=worker.memory_bytes,
                )
                for worker in event.workers
            ),
        )

    def _fresh_usage(self, now: datetime) -> list[_NodeUsage]:
        for node, usage in list(self._usage.items()):
            if now - usage.received_at > usage.valid_for:
                del self._usage[node]
        return list(self._usage.values())

    async def refresh(self) -> ClusterSnapshot:
        """Re-read nodes, GPUs and active allocations from the ledger.

        Allocations are read first: a GPU is registered before anything is placed on it, so every GPU
        a share of the snapshot is on is in its GPUs too (read the other way round, a GPU registered and
        filled between the two reads would be missing, and a recommendation for it would go uncapped)."""
        allocations = await self.ledger.active_allocations()
        nodes = await self.ledger.list_nodes()
        gpus = await self.ledger.list_gpus()
        now = self.clock()
        shares = tuple(
            WorkerShare(
                allocation_id=str(allocation.allocation_id),
                namespace=allocation.workload.namespace,
                pod=allocation.workload.name,
                workload=allocation.workload.workload or allocation.workload.name,
                qos=allocation.qos,
                pool=allocation.pool,
                gpu_uuid=share.gpu_uuid,
                request_tflops_milli=share.tflops_milli,
                request_vram_bytes=share.vram_bytes,
                limit_tflops_milli=share.limit_tflops_milli,
                limit_vram_bytes=share.limit_vram_bytes,
            )
            for allocation in allocations
            for share in allocation.shares
        )
        usage = self._fresh_usage(now)
        self.snapshot = ClusterSnapshot(
            now=now,
            nodes=tuple(
                NodeState(
                    name=n.name,
                    pool=n.pool,
                    ready=n.ready,
                    last_heartbeat_at=n.last_heartbeat_at,
                    cordoned=n.cordoned,
                    do_not_disrupt=n.labels.get(DO_NOT_DISRUPT_LABEL) == "true",
                )
                for n in nodes
            ),
            gpus=tuple(
                GpuState(
                    uuid=g.uuid,
                    node=g.node,
                    index=g.index,
                    model=g.model,
                    phase=g.phase,
                    capacity_tflops_milli=g.capacity_tflops_milli,
                    capacity_vram_bytes=g.capacity_vram_bytes,
                    used_tflops_milli=g.used_tflops_milli,
                    used_vram_bytes=g.used_vram_bytes,
                )
                for g in gpus
            ),
            shares=shares,
            gpu_usage=tuple(sample for node in usage for sample in node.gpus),
            worker_usage=tuple(sample for node in usage for sample in node.workers),
        )
        self.last_error = None
        return self.snapshot

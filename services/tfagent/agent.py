"""`NodeAgent`: the agent's I/O shell. Registers the node, sends heartbeats, rediscovers and samples GPUs.

It owns the agent's live state (inventory, allocations on this node, the last sample) and publishes what
happens as events on the bus. Every decision (capacity, missing GPUs, usage rows, drift) comes from
`tfagent.core`; probe calls run in a worker thread so a slow driver never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from uuid import UUID, uuid4

from tfcommon.bus import EventBus
from tfcommon.events import (
    AllocationCreated,
    AllocationReleased,
    DriftDetected,
    GpuDisappeared,
    GpuDiscovered,
    GpuUsageReported,
    Message,
    NodeHeartbeatSent,
    NodeRegistered,
)

from tfagent.core.inventory import GpuDevice, GpuPhase, InventoryChange, NodeInventory, merge_rediscovery
from tfagent.core.usage import (
    NodeUsage,
    UsageSample,
    WorkerAllocation,
    build_node_usage,
    detect_drift,
    drift_started,
)
from tfagent.ports import GpuProbe, ProcessOwners

log = logging.getLogger("tfagent.agent")

REGISTER_RETRY_S = 1.0
RELEASED_REMEMBERED = 100_000
"""Released allocation ids kept to ignore their late creations (about 10 MB at most)."""
"""How long the agent waits before announcing itself again after a failed registration."""


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class AgentTimers:
    """How often the agent sends heartbeats, samples usage and rediscovers GPUs, in seconds."""

    heartbeat_interval_s: float = 5.0
    sample_interval_s: float = 5.0
    discovery_interval_s: float = 300.0


@dataclass(frozen=True)
class Sampled:
    """The last sampling round: raw sample, pid-to-allocation map and the rows published."""

    at: datetime
    sample: UsageSample
    owners: Mapping[int, UUID]
    usage: NodeUsage


class NodeAgent:
    """One node's agent. Call `register()` once, then `run(stopping)` until shutdown."""

    def __init__(
        self,
        *,
        node: str,
        pool: str,
        probe: GpuProbe,
        owners: ProcessOwners,
        bus: EventBus,
        timers: AgentTimers | None = None,
        agent_url: str | None = None,
        clock: Callable[[], datetime] = utc_now,
        on_inventory: Callable[[NodeInventory], None] | None = None,
    ) -> None:
        """`on_inventory` is called with the inventory after every discovery round (start, rediscovery)."""
        self.node = node
        self.pool = pool
        self.timers = timers or AgentTimers()
        self.agent_url = agent_url
        self._probe = probe
        self._owners = owners
        self._bus = bus
        self._clock = clock
        self._inventory: NodeInventory | None = None
        self._allocations: dict[UUID, WorkerAllocation] = {}
        self._released: OrderedDict[UUID, None] = OrderedDict()
        self._reported_drift: set[tuple[str, str, str]] = set()
        self._discovery_lock = asyncio.Lock()
        self._on_inventory = on_inventory
        self.last_sampled: Sampled | None = None

    @property
    def inventory(self) -> NodeInventory | None:
        return self._inventory

    def allocations(self) -> tuple[WorkerAllocation, ...]:
        return tuple(self._allocations.values())

    def allocation(self, worker_id: str) -> WorkerAllocation | None:
        """The allocation whose id, or whose pod UID, is `worker_id`."""
        for allocation in self._allocations.values():
            if worker_id in (str(allocation.allocation_id), allocation.workload.uid):
                return allocation
        return None

    async def register(self) -> NodeInventory:
        """Discover the GPUs, then announce the node and each GPU (again after every restart)."""
        change = await self._rediscover()
        await self._announce(change.inventory)
        return change.inventory

    async def register_until_done(
        self, stopping: asyncio.Event, retry_s: float = REGISTER_RETRY_S
    ) -> NodeInventory | None:
        """`register`, tried again every `retry_s` while it fails (NATS restarting, say) instead of
        stopping the agent; None when `stopping` is set first."""
        while not stopping.is_set():
            try:
                return await self.register()
            except Exception as error:
                log.warning(
                    "registration failed; trying again",
                    extra={
                        "event": "agent.register",
                        "outcome": "error",
                        "error": str(error).splitlines()[0] if str(error) else type(error).__name__,
                        "retry_s": retry_s,
                    },
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), timeout=retry_s)
        return None

    async def reregister(self) -> InventoryChange:
        """Discover again and announce the node and each present GPU as at start (`DiscoverGpus`), and
        the GPUs that went missing or were removed."""
        change = await self._rediscover()
        await self._announce(change.inventory)
        await self._publish_gone(change)
        return change

    async def _announce(self, inventory: NodeInventory) -> None:
        await self._publish(
            NodeRegistered(
                event_id=uuid4(),
                occurred_at=self._clock(),
                node=self.node,
                pool=self.pool,
                gpu_count=len(inventory.gpus),
                simulated=inventory.simulated,
                driver_version=inventory.driver_version,
                cuda_version=inventory.cuda_version,
                agent_url=self.agent_url,
            )
        )
        for warning in inventory.warnings:
            log.warning(warning, extra={"event": "gpu.unknown-model", "node": self.node})
        for gpu in inventory.gpus:
            if gpu.phase is GpuPhase.RUNNING:
                await self._publish(self._discovered(gpu))

    async def rediscover(self) -> InventoryChange:
        """Discover again and publish what changed: new GPUs, GPUs gone missing (`Unknown`) or removed."""
        change = await self._rediscover()
        for gpu in change.appeared:
            await self._publish(self._discovered(gpu))
        await self._publish_gone(change)
        return change

    async def _publish_gone(self, change: InventoryChange) -> None:
        for gpu in (*change.went_missing, *change.removed):
            log.warning(
                "GPU %s is no longer reported by the driver", gpu.uuid, extra={"event": "gpu.disappeared"}
            )
            await self._publish(
                GpuDisappeared(event_id=uuid4(), occurred_at=self._clock(), node=self.node, gpu_uuid=gpu.uuid)
            )

    async def heartbeat(self) -> None:
        gpu_count = 0 if self._inventory is None else len(self._inventory.gpus)
        await self._publish(
            NodeHeartbeatSent(
                event_id=uuid4(),
                occurred_at=self._clock(),
                node=self.node,
                pool=self.pool,
                gpu_count=gpu_count,
                interval_ms=round(self.timers.heartbeat_interval_s * 1000),
            )
        )

    async def sample(self) -> Sampled:
        """One sampling round: publish the batched usage report and any drift that just started."""
        inventory = self._inventory or (await self._rediscover()).inventory
        sample = await asyncio.to_thread(self._probe.sample)
        allocations = self.allocations()
        owners = self._owners.owners(sample.processes, allocations)
        usage = build_node_usage(inventory.gpus, sample, allocations, owners)
        sampled = Sampled(at=self._clock(), sample=sample, owners=owners, usage=usage)
        self.last_sampled = sampled
        await self._publish(
            GpuUsageReported(
                event_id=uuid4(),
                occurred_at=self._clock(),
                node=self.node,
                pool=self.pool,
                sampled_at=sampled.at,
                interval_ms=round(self.timers.sample_interval_s * 1000),
                simulated=inventory.simulated,
                gpus=usage.gpus,
                workers=usage.workers,
            )
        )
        drifts = detect_drift(sample.processes, allocations, owners)
        for drift in drift_started(self._reported_drift, drifts):
            await self._publish(
                DriftDetected(
                    event_id=uuid4(),
                    occurred_at=self._clock(),
                    node=self.node,
                    gpu_uuid=drift.gpu_uuid,
                    kind=drift.kind.value,
                    detail=drift.detail,
                    workload=None if drift.allocation is None else drift.allocation.workload,
                    pid=drift.pid,
                    memory_bytes=drift.used_bytes,
                    limit_bytes=drift.limit_bytes,
                )
            )
        self._reported_drift = {drift.key for drift in drifts}
        return sampled

    def restore(self, allocations: Iterable[WorkerAllocation]) -> None:
        """Start from the ledger's open allocations on this node: after a restart, the durable
        consumer delivers only what changed since the last acknowledged event. One whose release the
        agent has followed meanwhile stays closed."""
        for allocation in allocations:
            if allocation.allocation_id not in self._released:
                self._allocations[allocation.allocation_id] = allocation

    async def track_allocation(self, message: Message) -> Sequence[Message]:
        """Pull-consumer handler: follow allocations placed on this node (idempotent under redelivery).

        An allocation id is never opened again once released, so a creation delivered after its
        release (a redelivery whose ack was lost, a republish after the duplicate window) is ignored.
        """
        if isinstance(message, AllocationCreated) and message.node == self.node:
            if message.allocation_id not in self._released:
                self._allocations[message.allocation_id] = WorkerAllocation.from_event(message)
        elif isinstance(message, AllocationReleased):
            self._allocations.pop(message.allocation_id, None)
            self._released[message.allocation_id] = None
            if len(self._released) > RELEASED_REMEMBERED:
                self._released.popitem(last=False)
        return ()

    async def run(self, stopping: asyncio.Event) -> None:
        """Heartbeat, sample and rediscover on their timers until `stopping` is set."""
        loop = asyncio.get_running_loop()
        timers = {
            self.heartbeat: self.timers.heartbeat_interval_s,
            self.sample: self.timers.sample_interval_s,
            self.rediscover: self.timers.discovery_interval_s,
        }
        due = dict.fromkeys(timers, loop.time())
        due[self.rediscover] += self.timers.discovery_interval_s
        while not stopping.is_set():
            now = loop.time()
            for action, interval in timers.items():
                if due[action] <= now:
                    due[action] = now + interval
                    try:
                        await action()
                    except Exception:
                        log.exception(
                            "agent timer failed", extra={"event": "agent.timer", "outcome": "error"}
                        )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), timeout=max(0.0, min(due.values()) - loop.time()))

    async def _rediscover(self) -> InventoryChange:
        async with self._discovery_lock:
            discovered = await asyncio.to_thread(self._probe.discover)
            allocated = {uuid for allocation in self._allocations.values() for uuid in allocation.gpu_uuids}
            change = merge_rediscovery(self._inventory, discovered, allocated, self._clock())
            self._inventory = change.inventory
            if self._on_inventory is not None:
                self._on_inventory(change.inventory)
            return change

    def _discovered(self, gpu: GpuDevice) -> GpuDiscovered:
        return GpuDiscovered(
            event_id=uuid4(),
            occurred_at=self._clock(),
            node=self.node,
            pool=self.pool,
            gpu_uuid=gpu.uuid,
            index=gpu.index,
            model=gpu.model,
            capacity_tflops_milli=gpu.tflops_milli,
            capacity_vram_bytes=gpu.vram_bytes,
            pci_bus_id=gpu.pci_bus_id,
            numa_node=gpu.numa_node,
            nvlink_peers=gpu.nvlink_peers,
            mig_enabled=gpu.mig_enabled,
            simulated=gpu.simulated,
        )

    async def _publish(self, message: Message) -> None:
        await self._bus.publish(message)

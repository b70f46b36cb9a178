"""Node-agent events into the ledger inventory: the scheduler is the single writer of nodes and GPUs.

`NodeRegistered` upserts the node, `GpuDiscovered` the GPU, `GpuDisappeared` marks it `Unknown`
(never deleted: allocations may still point at it), `NodeHeartbeatSent` stamps the heartbeat. Every
handler is idempotent (redelivery rewrites the same values) and returns no events.
"""

from __future__ import annotations

from collections.abc import Sequence

from tfcommon.consumer import Handler
from tfcommon.events import GpuDisappeared, GpuDiscovered, Message, NodeHeartbeatSent, NodeRegistered
from tfcommon.ledger.port import Ledger
from tfcommon.ledger.records import GpuSpec, LedgerInputError, NodeSpec

from tfscheduler.engine import Scheduler


def inventory_handler(ledger: Ledger, scheduler: Scheduler) -> Handler:
    """The `scheduler-track-nodes` consumer's handler."""

    async def track_nodes(message: Message) -> Sequence[Message]:
        if isinstance(message, NodeRegistered):
            await ledger.upsert_node(NodeSpec(name=message.node, pool=message.pool))
            await ledger.record_heartbeat(message.node)
            await scheduler.node_changed(message.node)
        elif isinstance(message, GpuDiscovered):
            try:
                await ledger.upsert_gpu(
                    GpuSpec(
                        uuid=message.gpu_uuid.lower(),
                        node=message.node,
                        index=message.index,
                        model=message.model,
                        vendor=message.vendor,
                        capacity_tflops_milli=message.capacity_tflops_milli,
                        capacity_vram_bytes=message.capacity_vram_bytes,
                        numa_node=message.numa_node,
                    )
                )
            except LedgerInputError:
                # The node's registration has not been stored yet: register it, then the GPU.
                await ledger.upsert_node(NodeSpec(name=message.node, pool=message.pool))
                raise
            await scheduler.node_changed(message.node)
        elif isinstance(message, GpuDisappeared):
            await ledger.set_gpu_phase(message.gpu_uuid.lower(), "Unknown")
            await scheduler.node_changed(message.node)
        elif isinstance(message, NodeHeartbeatSent):
            scheduler.heartbeat(message.node, message.interval_ms)
            if not await ledger.record_heartbeat(message.node):
                await ledger.upsert_node(NodeSpec(name=message.node, pool=message.pool))
                await ledger.record_heartbeat(message.node)
                await scheduler.node_changed(message.node)
        return ()

    return track_nodes

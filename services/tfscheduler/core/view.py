"""Build the placement core's view from ledger facts, and a placement request from a submission.

Pure. The view's rules (GPU phase, index checks, taints, workers) and the sizing of a request are
`tfcommon.placement.from_ledger`'s, shared with the defrag planner; this module adds the scheduler's
reasons to keep a node from new work (cordoned, agent not ready or silent, being drained by the defrag
planner), and `blocked` says why. A blocked node stays in the view as cordoned.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from uuid import UUID, uuid5

from tfcommon.events import WorkloadRef
from tfcommon.node_readiness import HeartbeatSeen, is_node_ready
from tfcommon.placement import Node, Placement
from tfcommon.placement.from_ledger import (
    AllocationFacts,
    GpuFacts,
    LedgerView,
    NodeFacts,
    placement_request,
    placement_view,
)

__all__ = [
    "ALLOCATION_NAMESPACE",
    "DEFAULT_HEARTBEAT_INTERVAL_MS",
    "DEFRAG_SOURCE",
    "ClusterSnapshot",
    "allocation_id_for",
    "build_snapshot",
    "node_block_reason",
    "placement_of",
    "placement_request",
]

DEFRAG_SOURCE = "tensor-fusion.ai/defrag-source"
DEFAULT_HEARTBEAT_INTERVAL_MS = 5_000
ALLOCATION_NAMESPACE = UUID("6b0f3a52-3f0e-4d55-9a43-2f1d7c1e5a10")


ClusterSnapshot = LedgerView
"""The placement nodes by name, and why some of them take no new work (node -> reason)."""


def allocation_id_for(workload: WorkloadRef) -> UUID:
    """The one allocation id a workload can ever hold: two schedulers placing it reserve the same id,
    so the ledger keeps at most one active allocation per workload."""
    return uuid5(ALLOCATION_NAMESPACE, f"{workload.namespace}/{workload.name}/{workload.uid or ''}")


def node_block_reason(
    node: NodeFacts,
    now: datetime,
    *,
    heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS,
    heartbeat_timeout: timedelta | None = None,
) -> str | None:
    """Why `node` must take no new placements, or None when it may."""
    if node.cordoned:
        return "node cordoned"
    if DEFRAG_SOURCE in node.annotations or DEFRAG_SOURCE in node.labels:
        return "node being drained by the defrag planner (tensor-fusion.ai/defrag-source)"
    if not node.ready:
        return "node agent reports not ready"
    seen = (
        None
        if node.last_heartbeat_at is None
        else HeartbeatSeen(node.name, node.last_heartbeat_at, heartbeat_interval_ms)
    )
    if not is_node_ready(seen, now, heartbeat_timeout):
        return "node agent heartbeats stopped"
    return None


def build_snapshot(
    nodes: Iterable[NodeFacts],
    gpus: Iterable[GpuFacts],
    allocations: Iterable[AllocationFacts],
    now: datetime,
    *,
    heartbeat_intervals_ms: Mapping[str, int] | None = None,
    heartbeat_timeout: timedelta | None = None,
    membership: Callable[[str, str], str | None] | None = None,
) -> ClusterSnapshot:
    """The placement view of the ledger: capacity and reservations per GPU, workers per GPU and node.
    `membership(node, pool)` says why a node is not in the pool it registered in (its labels miss the
    pool's nodeSelector): such a node is blocked too."""
    intervals = heartbeat_intervals_ms or {}
    return placement_view(
        nodes,
        gpus,
        allocations,
        block_reason=lambda node: (
            node_block_reason(
                node,
                now,
                heartbeat_interval_ms=intervals.get(node.name, DEFAULT_HEARTBEAT_INTERVAL_MS),
                heartbeat_timeout=heartbeat_timeout,
            )
            or (membership(node.name, node.pool) if membership is not None else None)
        ),
    )


def placement_of(allocation: AllocationFacts, node: Node) -> Placement:
    """What `allocation` holds on `node`, as the placement core's `Placement` (to release it in a view)."""
    index_of = {gpu.uuid: gpu.index for gpu in node.gpus}
    shares = sorted(allocation.shares, key=lambda share: index_of.get(share.gpu_uuid, -1))
    whole = allocation.isolation == "shared"
    count = len(shares)
    return Placement(
        request_name=allocation.workload.name,
        node=allocation.node,
        gpu_indices=tuple(index_of[share.gpu_uuid] for share in shares),
        gpu_uuids=tuple(share.gpu_uuid for share in shares),
        tflops_milli=tuple(share.tflops_milli for share in shares),
        vram_bytes=tuple(share.vram_bytes for share in shares),
        cpu_milli=0,
        memory_bytes=0,
        workload_class=f"{count}-gpu" if whole else ("share" if count == 1 else f"{count}-gpu-share"),
        score=0,
        policy="ledger",
        limit_tflops_milli=tuple(share.limit_tflops_milli for share in shares),
        limit_vram_bytes=tuple(share.limit_vram_bytes for share in shares),
    )

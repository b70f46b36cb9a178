"""Build the placement core's view from ledger facts, and a placement request from a submission.

Pure. The view's rules (GPU phase, index checks, taints, workers) and the sizing of a request are
`tfcommon.placement.from_ledger`'s, shared with the defrag planner; this module adds the scheduler's
reasons to keep a node from new work (cordoned, agent not ready or silent, being drained by the defrag
planner), and `blocked` says why, and until when a reason holds by time alone (`reason_holds_until`).
A blocked node stays in the view as cordoned. It also shapes two placements of the scheduler's own: a
replacement into the defrag hold kept for it (`into_hold`), and one kept off the GPUs of the workload
it replaces (`with_gpus_full`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid5

from tfcommon.events import GpuRequest, WorkloadRef
from tfcommon.node_readiness import HeartbeatSeen, is_node_ready, readiness_timeout
from tfcommon.placement import Node, Placement, PlacementRequest
from tfcommon.placement.from_ledger import (
    AllocationFacts,
    GpuFacts,
    LedgerView,
    NodeFacts,
    placement_request,
    placement_view,
)

from tfscheduler.submission import Submission

__all__ = [
    "ALLOCATION_NAMESPACE",
    "DEFAULT_HEARTBEAT_INTERVAL_MS",
    "DEFRAG_SOURCE",
    "ClusterSnapshot",
    "allocation_id_for",
    "build_snapshot",
    "into_hold",
    "node_block_reason",
    "placement_of",
    "placement_request",
    "placement_request_of",
    "reason_holds_until",
    "with_gpus_full",
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


def reason_holds_until(
    name: str,
    last_heartbeat_at: datetime | None,
    heartbeat_interval_ms: int,
    heartbeat_timeout: timedelta | None,
    now: datetime,
) -> datetime:
    """Until when `node_block_reason` stays what it is now for a node whose flags do not change: until
    its heartbeat goes stale; for ever when it has none or it is stale already."""
    never = datetime.max.replace(tzinfo=UTC)
    if last_heartbeat_at is None:
        return never
    seen = HeartbeatSeen(name, last_heartbeat_at, heartbeat_interval_ms)
    stale_at = last_heartbeat_at + readiness_timeout(seen, heartbeat_timeout)
    return stale_at if now < stale_at else never


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


def placement_request_of(submission: Submission, request: GpuRequest) -> PlacementRequest:
    """What the placement core is asked for a submission: `request` (its GPU request, with a namespace
    quota's defaults where one applies) for `namespace/name`, with the submission's tolerations and node
    selector. Raises `PlacementRequestError` when the request is invalid."""
    workload = submission.workload
    return placement_request(
        f"{workload.namespace}/{workload.name}",
        request,
        tolerations=submission.tolerations,
        node_selector=submission.node_selector,
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


def into_hold(held: Placement, wanted: PlacementRequest, node: Node) -> Placement | None:
    """`wanted` on the GPUs that `held` keeps on `node` (a defrag hold), sized on each of those GPUs, as
    a `defrag-hold` placement; None when it asks another number of GPUs or a held GPU is no longer on
    the node. Whether it asks more than the hold keeps is the ledger's check (`SqlLedger.claim_hold`)."""
    gpus = {gpu.uuid: gpu for gpu in node.gpus}
    if wanted.gpu_count != len(held.gpu_uuids) or any(uuid not in gpus for uuid in held.gpu_uuids):
        return None
    chosen = [gpus[uuid] for uuid in held.gpu_uuids]
    return replace(
        held,
        request_name=wanted.name,
        tflops_milli=tuple(wanted.tflops_on(gpu) for gpu in chosen),
        vram_bytes=tuple(wanted.vram_on(gpu) for gpu in chosen),
        policy="defrag-hold",
        limit_tflops_milli=tuple(wanted.limit_tflops_on(gpu) for gpu in chosen),
        limit_vram_bytes=tuple(wanted.limit_vram_on(gpu) for gpu in chosen),
    )


def with_gpus_full(node: Node, gpu_uuids: frozenset[str]) -> Node:
    """`node` as if nothing were left on the GPUs `gpu_uuids`."""
    gpus = tuple(
        replace(gpu, used_tflops_milli=gpu.tflops_milli, used_vram_bytes=gpu.vram_bytes)
        if gpu.uuid in gpu_uuids
        else gpu
        for gpu in node.gpus
    )
    return replace(node, gpus=gpus)

"""Build the placement core's view from ledger facts, and a placement request from a submission.

Pure. Ledger records reach this module through small read-only protocols (the shell passes
`tfcommon.ledger.records` objects), so the core never imports the ledger. A node that must not take
new work (cordoned, agent not ready or silent, being drained by the defrag planner, GPU inventory
incomplete) is kept in the view as cordoned, and `blocked` says why.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol
from uuid import UUID, uuid5

from tfcommon.events import GpuRequest, WorkloadRef
from tfcommon.node_readiness import HeartbeatSeen, is_node_ready
from tfcommon.placement import (
    Gpu,
    Isolation,
    Node,
    Placement,
    PlacementRequest,
    Taint,
    Toleration,
)

DEFRAG_SOURCE = "tensor-fusion.ai/defrag-source"
DEFAULT_HEARTBEAT_INTERVAL_MS = 5_000
ALLOCATION_NAMESPACE = UUID("6b0f3a52-3f0e-4d55-9a43-2f1d7c1e5a10")


class NodeFacts(Protocol):
    """What the view needs of a node (satisfied by `tfcommon.ledger.records.NodeRecord`)."""

    @property
    def name(self) -> str: ...
    @property
    def pool(self) -> str: ...
    @property
    def labels(self) -> Mapping[str, str]: ...
    @property
    def taints(self) -> Sequence[Mapping[str, str]]: ...
    @property
    def annotations(self) -> Mapping[str, str]: ...
    @property
    def cpu_allocatable_milli(self) -> int: ...
    @property
    def memory_allocatable_bytes(self) -> int: ...
    @property
    def cordoned(self) -> bool: ...
    @property
    def ready(self) -> bool: ...
    @property
    def last_heartbeat_at(self) -> datetime | None: ...


class GpuFacts(Protocol):
    """What the view needs of a GPU (satisfied by `tfcommon.ledger.records.GpuRecord`)."""

    @property
    def uuid(self) -> str: ...
    @property
    def node(self) -> str: ...
    @property
    def index(self) -> int: ...
    @property
    def model(self) -> str: ...
    @property
    def vendor(self) -> str: ...
    @property
    def capacity_tflops_milli(self) -> int: ...
    @property
    def capacity_vram_bytes(self) -> int: ...
    @property
    def used_tflops_milli(self) -> int: ...
    @property
    def used_vram_bytes(self) -> int: ...
    @property
    def phase(self) -> str: ...
    @property
    def numa_node(self) -> int | None: ...


class ShareFacts(Protocol):
    """One GPU share of an allocation (satisfied by `tfcommon.ledger.records.ShareRecord`)."""

    @property
    def gpu_uuid(self) -> str: ...
    @property
    def tflops_milli(self) -> int: ...
    @property
    def vram_bytes(self) -> int: ...
    @property
    def limit_tflops_milli(self) -> int: ...
    @property
    def limit_vram_bytes(self) -> int: ...


class AllocationFacts(Protocol):
    """An active allocation (satisfied by `tfcommon.ledger.records.AllocationRecord`)."""

    @property
    def allocation_id(self) -> UUID: ...
    @property
    def workload(self) -> WorkloadRef: ...
    @property
    def pool(self) -> str: ...
    @property
    def node(self) -> str: ...
    @property
    def qos(self) -> str: ...
    @property
    def isolation(self) -> str: ...
    @property
    def created_at(self) -> datetime: ...
    @property
    def shares(self) -> Sequence[ShareFacts]: ...


@dataclass(frozen=True)
class ClusterSnapshot:
    """The placement nodes by name, and why some of them take no new work (node -> reason)."""

    nodes: Mapping[str, Node]
    blocked: Mapping[str, str] = field(default_factory=dict)


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
) -> ClusterSnapshot:
    """The placement view of the ledger: capacity and reservations per GPU, workers per GPU and node."""
    gpus_by_node: dict[str, list[GpuFacts]] = {}
    for gpu in gpus:
        gpus_by_node.setdefault(gpu.node, []).append(gpu)
    workers_by_gpu: dict[str, int] = {}
    workers_by_node: dict[str, int] = {}
    for allocation in allocations:
        workers_by_node[allocation.node] = workers_by_node.get(allocation.node, 0) + 1
        for share in allocation.shares:
            workers_by_gpu[share.gpu_uuid] = workers_by_gpu.get(share.gpu_uuid, 0) + 1
    intervals = heartbeat_intervals_ms or {}
    built: dict[str, Node] = {}
    blocked: dict[str, str] = {}
    for node in nodes:
        reason = node_block_reason(
            node,
            now,
            heartbeat_interval_ms=intervals.get(node.name, DEFAULT_HEARTBEAT_INTERVAL_MS),
            heartbeat_timeout=heartbeat_timeout,
        )
        ordered = sorted(gpus_by_node.get(node.name, []), key=lambda gpu: gpu.index)
        if any(gpu.index != position for position, gpu in enumerate(ordered)):
            reason = reason or "GPU inventory incomplete (indices are not 0..N-1)"
            ordered = []
        if reason is not None:
            blocked[node.name] = reason
        built[node.name] = Node(
            name=node.name,
            cpu_milli=node.cpu_allocatable_milli,
            memory_bytes=node.memory_allocatable_bytes,
            gpus=tuple(placement_gpu(gpu, workers_by_gpu.get(gpu.uuid, 0)) for gpu in ordered),
            labels=dict(node.labels),
            taints=tuple(
                Taint(key=t.get("key", ""), value=t.get("value", ""), effect=t.get("effect", "NoSchedule"))
                for t in node.taints
            ),
            cordoned=reason is not None,
            pool=node.pool,
            workers=workers_by_node.get(node.name, 0),
        )
    return ClusterSnapshot(nodes=built, blocked=blocked)


def placement_gpu(gpu: GpuFacts, workers: int) -> Gpu:
    """The placement core's GPU for a ledger GPU hosting `workers` workers (full unless `Running`)."""
    if gpu.phase != "Running":
        # A GPU that is not Running takes nothing new: present it as full.
        used_tflops, used_vram = gpu.capacity_tflops_milli, gpu.capacity_vram_bytes
    else:
        used_tflops, used_vram = gpu.used_tflops_milli, gpu.used_vram_bytes
    return Gpu(
        uuid=gpu.uuid,
        index=gpu.index,
        model=gpu.model,
        tflops_milli=gpu.capacity_tflops_milli,
        vram_bytes=gpu.capacity_vram_bytes,
        vendor=gpu.vendor.lower(),
        used_tflops_milli=used_tflops,
        used_vram_bytes=used_vram,
        workers=workers,
        numa_node=gpu.numa_node,
    )


def placement_request(
    name: str,
    request: GpuRequest,
    *,
    tolerations: Sequence[Mapping[str, str]] = (),
    node_selector: Mapping[str, str] | None = None,
) -> PlacementRequest:
    """The placement core's request for a submitted workload; raises `PlacementRequestError` (a
    `ValueError` naming the field) when the request cannot be placed as given."""
    models = frozenset(part.strip() for part in (request.gpu_model or "").split("|") if part.strip())
    percent = request.compute_percent_request
    return PlacementRequest(
        name=name,
        gpu_count=request.gpu_count,
        tflops_milli=0 if percent is not None else request.tflops_request_milli,
        vram_bytes=request.vram_request_bytes,
        compute_percent=percent,
        isolation=Isolation(request.isolation),
        gpu_models=models,
        tolerations=tuple(
            Toleration(
                key=t.get("key", ""),
                operator=t.get("operator", "Equal"),
                value=t.get("value", ""),
                effect=t.get("effect", ""),
            )
            for t in tolerations
        ),
        node_selector=dict(node_selector or {}),
        pool=request.pool,
        qos=request.qos,
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
    )

"""The placement view of the ledger, and the request a placed workload is sized with: one set of rules
that the scheduler and the defrag planner both use.

Pure: no I/O, no clock. Ledger records reach this module through small read-only protocols (callers pass
`tfcommon.ledger.records` objects), so the placement core never imports the ledger.

The view's rules:
- a GPU that is not `Running` takes nothing new: it is presented as full;
- a node whose GPU indices are not exactly 0..N-1 (inventory incomplete) gets no GPUs and is blocked;
- a node the caller's `block_reason` names is blocked too; a blocked node is kept, as cordoned;
- taints are the node's (`effect` defaults to `NoSchedule`); workers are counted per GPU and per node
  from the active allocations.

A placed workload is sized as the scheduler sized it when it placed it: from the pod's request
(`tfcommon.pod_request`: GPU count, per-GPU TFLOPS or compute percent of each card, VRAM, model), so a
compute-percent workload asks that percent of whichever card it is moved to; an amount the pod leaves at
zero, which the scheduler filled from the namespace quota's defaults, is taken from its shares. Only
without a readable pod is it sized from the ledger's shares alone: each GPU asks the largest share.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol
from uuid import UUID

from tfcommon.cluster.model import Pod
from tfcommon.events import GpuRequest, WorkloadRef
from tfcommon.placement.model import (
    Gpu,
    Isolation,
    Node,
    PlacementRequest,
    PlacementRequestError,
    Taint,
    Toleration,
)
from tfcommon.pod_request import PodRequestError, gpu_request_of
from tfcommon.pod_spec import GPU_MODEL

INCOMPLETE_INVENTORY = "GPU inventory incomplete (indices are not 0..N-1)"


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
class LedgerView:
    """The placement nodes by name, and why some of them take no new work (node -> reason)."""

    nodes: Mapping[str, Node]
    blocked: Mapping[str, str] = field(default_factory=dict)


def placement_view(
    nodes: Iterable[NodeFacts],
    gpus: Iterable[GpuFacts],
    allocations: Iterable[AllocationFacts],
    *,
    block_reason: Callable[[NodeFacts], str | None] | None = None,
) -> LedgerView:
    """The placement view of `nodes`: capacity and reservations per GPU, workers per GPU and node.
    `block_reason` says why a node must take no new work (None: it may); GPUs and allocations on other
    nodes are ignored."""
    gpus_by_node: dict[str, list[GpuFacts]] = {}
    for gpu in gpus:
        gpus_by_node.setdefault(gpu.node, []).append(gpu)
    workers_by_gpu: dict[str, int] = {}
    workers_by_node: dict[str, int] = {}
    limits_by_node: dict[str, tuple[int, int]] = {}
    for allocation in allocations:
        workers_by_node[allocation.node] = workers_by_node.get(allocation.node, 0) + 1
        tflops, vram = limits_by_node.get(allocation.node, (0, 0))
        for share in allocation.shares:
            workers_by_gpu[share.gpu_uuid] = workers_by_gpu.get(share.gpu_uuid, 0) + 1
            tflops += share.limit_tflops_milli
            vram += share.limit_vram_bytes
        limits_by_node[allocation.node] = (tflops, vram)
    built: dict[str, Node] = {}
    blocked: dict[str, str] = {}
    for node in nodes:
        reason = block_reason(node) if block_reason is not None else None
        ordered = sorted(gpus_by_node.get(node.name, []), key=lambda gpu: gpu.index)
        if any(gpu.index != position for position, gpu in enumerate(ordered)):
            reason = reason or INCOMPLETE_INVENTORY
            ordered = []
        if reason is not None:
            blocked[node.name] = reason
        built[node.name] = Node(
            name=node.name,
            cpu_milli=node.cpu_allocatable_milli,
            memory_bytes=node.memory_allocatable_bytes,
            gpus=tuple(placement_gpu(gpu, workers_by_gpu.get(gpu.uuid, 0)) for gpu in ordered),
            labels=dict(node.labels),
            taints=placement_taints(node.taints),
            cordoned=reason is not None,
            pool=node.pool,
            workers=workers_by_node.get(node.name, 0),
            limit_tflops_milli=limits_by_node.get(node.name, (0, 0))[0],
            limit_vram_bytes=limits_by_node.get(node.name, (0, 0))[1],
        )
    return LedgerView(nodes=built, blocked=blocked)


def placement_gpu(gpu: GpuFacts, workers: int) -> Gpu:
    """The placement core's GPU for a ledger GPU hosting `workers` workers (full unless `Running`)."""
    if gpu.phase != "Running":
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


def placement_taints(taints: Iterable[Mapping[str, str]]) -> tuple[Taint, ...]:
    """Ledger taints (`key`, `value`, `effect` maps) as placement taints; `effect` defaults to NoSchedule."""
    return tuple(
        Taint(key=t.get("key", ""), value=t.get("value", ""), effect=t.get("effect", "NoSchedule"))
        for t in taints
    )


def placement_request(
    name: str,
    request: GpuRequest,
    *,
    tolerations: Sequence[Mapping[str, str]] = (),
    node_selector: Mapping[str, str] | None = None,
) -> PlacementRequest:
    """The placement core's request for a workload's `GpuRequest`; raises `PlacementRequestError` (a
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
        limit_tflops_milli=request.tflops_limit_milli,
        limit_vram_bytes=request.vram_limit_bytes,
        limit_compute_percent=None if percent is None else max(request.compute_percent_limit or 0, percent),
    )


def placed_request(allocation: AllocationFacts, pod: Pod | None) -> PlacementRequest:
    """The request a placed workload (`allocation`, bound as `pod`) is moved with: the pod's own request
    as the scheduler reads it, in the allocation's pool, with a per-GPU amount the pod leaves at zero
    taken from the shares (the scheduler filled it from the namespace quota's defaults). From the
    allocation's shares alone when there is no pod, its annotations cannot be read, or they ask another
    GPU count than the allocation holds."""
    name = f"{allocation.workload.namespace}/{allocation.workload.name}"
    tolerations = tuple(
        {"key": t.key, "operator": t.operator, "value": t.value, "effect": t.effect}
        for t in (pod.tolerations if pod is not None else ())
    )
    node_selector = dict(pod.node_selector) if pod is not None else {}
    held_tflops = max((share.tflops_milli for share in allocation.shares), default=0)
    held_vram = max((share.vram_bytes for share in allocation.shares), default=0)
    try:
        asked = None if pod is None else gpu_request_of(pod, default_pool=allocation.pool)
    except PodRequestError:
        asked = None
    if asked is not None and asked.gpu_count == len(allocation.shares):
        filled = asked.model_copy(
            update={
                "pool": allocation.pool,
                "vram_request_bytes": asked.vram_request_bytes or held_vram,
                "tflops_request_milli": asked.tflops_request_milli
                or (0 if asked.compute_percent_request is not None else held_tflops),
            }
        )
        try:
            return placement_request(name, filled, tolerations=tolerations, node_selector=node_selector)
        except PlacementRequestError:
            pass
    raw_models = pod.annotations.get(GPU_MODEL, "") if pod is not None else ""
    shared = Isolation(allocation.isolation) is Isolation.SHARED
    return PlacementRequest(
        name=name,
        gpu_count=len(allocation.shares),
        tflops_milli=0 if shared else held_tflops,
        vram_bytes=0 if shared else held_vram,
        isolation=Isolation(allocation.isolation),
        gpu_models=frozenset(part.strip() for part in raw_models.split("|") if part.strip()),
        tolerations=tuple(Toleration(**t) for t in tolerations),
        node_selector=node_selector,
        pool=allocation.pool,
        qos=allocation.qos,
    )

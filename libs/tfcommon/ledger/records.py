"""What the ledger takes and returns: frozen dataclasses, validated on construction. No I/O here.

Callers never see table rows. Quantities are integers (milli-TFLOPS, bytes); times are timezone-aware.
A bad value raises `LedgerInputError`, whose message names the field and the expected form.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, NamedTuple, get_args
from uuid import UUID

from tfcommon.events import IsolationMode, QosLevel, WorkloadRef
from tfcommon.quantities import format_bytes, format_milli

QoS = QosLevel
Isolation = IsolationMode
GpuPhase = Literal["Pending", "Running", "Updating", "Unknown", "Destroying", "Migrating"]
AllocationState = Literal["reserved", "committed", "released"]
HistoryKind = Literal["opened", "committed", "released", "evicted"]
Resource = Literal["tflops", "vram"]

QOS_LEVELS: tuple[QoS, ...] = get_args(QosLevel)
ISOLATION_MODES: tuple[Isolation, ...] = get_args(IsolationMode)
GPU_PHASES: tuple[GpuPhase, ...] = ("Pending", "Running", "Updating", "Unknown", "Destroying", "Migrating")


class LedgerInputError(ValueError):
    """A value handed to the ledger is malformed; the message names the field and the fix."""


def _require_name(field_name: str, value: str) -> None:
    if not value or value != value.strip():
        raise LedgerInputError(f"{field_name}: {value!r} must be a non-empty name without surrounding spaces")


def _require_not_negative(field_name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise LedgerInputError(f"{field_name}: {value!r} must be an integer (parse with tfcommon.quantities)")
    if value < 0:
        raise LedgerInputError(f"{field_name}: {value} must be zero or more")


def _require_one_of(field_name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise LedgerInputError(f"{field_name}: {value!r} is not one of {', '.join(allowed)}")


def _require_aware(field_name: str, value: datetime | None) -> None:
    if value is not None and value.utcoffset() is None:
        raise LedgerInputError(f"{field_name}: {value!r} must be timezone-aware (e.g. datetime.now(UTC))")


def _require_gpu_uuid(field_name: str, value: str) -> None:
    _require_name(field_name, value)
    if value != value.lower():
        raise LedgerInputError(
            f"{field_name}: {value!r} must be lower case (GPU UUIDs are stored lower case)"
        )


DEFRAG_SOURCE_MARKER = "tensor-fusion.ai/defrag-source"
"""The node label (or annotation) the defrag planner sets on a node it drains; the ledger refuses new
reservations there."""
PLANNER_MARKER_PREFIXES = ("tensor-fusion.ai/defrag-", "tensor-fusion.ai/should-delete")
"""Node labels and annotations the defrag planner owns: a node's re-registration keeps them."""
OPERATOR_NODE_LABELS = ("tensor-fusion.ai/do-not-disrupt",)
"""Node labels an operator sets in local mode (`tfctl label node`, `PATCH /api/v1/nodes/{name}`): a node's
re-registration keeps them too."""


@dataclass(frozen=True)
class NodeSpec:
    """A node as its agent registers it. Upserting never changes `cordoned` (that flag has its own call)."""

    name: str
    pool: str
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: Sequence[Mapping[str, str]] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    cpu_allocatable_milli: int = 0
    memory_allocatable_bytes: int = 0
    ready: bool = True

    def __post_init__(self) -> None:
        _require_name("node.name", self.name)
        _require_name("node.pool", self.pool)
        _require_not_negative("node.cpu_allocatable_milli", self.cpu_allocatable_milli)
        _require_not_negative("node.memory_allocatable_bytes", self.memory_allocatable_bytes)


@dataclass(frozen=True)
class GpuSpec:
    """A GPU as its agent discovers it. Upserting keeps `used_*` (only reservations change those)."""

    uuid: str
    node: str
    index: int
    model: str
    vendor: str
    capacity_tflops_milli: int
    capacity_vram_bytes: int
    phase: GpuPhase = "Running"
    numa_node: int | None = None

    def __post_init__(self) -> None:
        _require_gpu_uuid("gpu.uuid", self.uuid)
        _require_name("gpu.node", self.node)
        _require_not_negative("gpu.index", self.index)
        _require_name("gpu.model", self.model)
        _require_name("gpu.vendor", self.vendor)
        _require_not_negative("gpu.capacity_tflops_milli", self.capacity_tflops_milli)
        _require_not_negative("gpu.capacity_vram_bytes", self.capacity_vram_bytes)
        _require_one_of("gpu.phase", self.phase, GPU_PHASES)


@dataclass(frozen=True)
class PoolRecord:
    name: str
    created_at: datetime


@dataclass(frozen=True)
class NodeRecord:
    name: str
    pool: str
    labels: Mapping[str, str]
    taints: Sequence[Mapping[str, str]]
    annotations: Mapping[str, str]
    cpu_allocatable_milli: int
    memory_allocatable_bytes: int
    cordoned: bool
    ready: bool
    last_heartbeat_at: datetime | None


class NodeState(NamedTuple):
    """What decides whether a node takes new work, without its labels, annotations or inventory:
    its flags, its last heartbeat, and whether the defrag planner's drain marker
    (`DEFRAG_SOURCE_MARKER`) is in its labels or annotations. A tuple, not a dataclass: the scheduler
    reads one for every node every second."""

    name: str
    pool: str
    cordoned: bool
    ready: bool
    last_heartbeat_at: datetime | None
    draining: bool


@dataclass(frozen=True)
class GpuRecord:
    """A GPU with its capacity and what the ledger has reserved on it; `version` grows on every change."""

    uuid: str
    node: str
    index: int
    model: str
    vendor: str
    capacity_tflops_milli: int
    capacity_vram_bytes: int
    used_tflops_milli: int
    used_vram_bytes: int
    phase: GpuPhase
    numa_node: int | None
    version: int

    @property
    def free_tflops_milli(self) -> int:
        return self.capacity_tflops_milli - self.used_tflops_milli

    @property
    def free_vram_bytes(self) -> int:
        return self.capacity_vram_bytes - self.used_vram_bytes


@dataclass(frozen=True)
class ShareRequest:
    """What to reserve on one GPU. Limits default to the requests; only requests take capacity."""

    gpu_uuid: str
    tflops_milli: int
    vram_bytes: int
    limit_tflops_milli: int | None = None
    limit_vram_bytes: int | None = None

    def __post_init__(self) -> None:
        _require_gpu_uuid("shares[].gpu_uuid", self.gpu_uuid)
        _require_not_negative("shares[].tflops_milli", self.tflops_milli)
        _require_not_negative("shares[].vram_bytes", self.vram_bytes)
        for name, limit, request in (
            ("limit_tflops_milli", self.limit_tflops_milli, self.tflops_milli),
            ("limit_vram_bytes", self.limit_vram_bytes, self.vram_bytes),
        ):
            if limit is not None:
                _require_not_negative(f"shares[].{name}", limit)
                if limit < request:
                    raise LedgerInputError(
                        f"shares[].{name}: {limit} is below the request {request}; a limit must be at least "
                        "the request (or omit it to use the request)"
                    )

    @property
    def effective_limit_tflops_milli(self) -> int:
        return self.tflops_milli if self.limit_tflops_milli is None else self.limit_tflops_milli

    @property
    def effective_limit_vram_bytes(self) -> int:
        return self.vram_bytes if self.limit_vram_bytes is None else self.limit_vram_bytes


@dataclass(frozen=True)
class ReservationRequest:
    """Reserve `shares` for one workload, all or nothing, in one transaction.

    `allocation_id` is chosen by the caller (derive it from the triggering event to make retries
    safe): reserving an id that already exists takes no capacity again and returns it as `replayed`.
    `cause` is the event id that led to the reservation; it is stored in the history.
    `eviction_protection_s` is the pod's `tensor-fusion.ai/eviction-protection` in seconds (None: none);
    billing charges `evictionProtectionPriceRatio` from the reservation until it ends.
    """

    allocation_id: UUID
    workload: WorkloadRef
    pool: str
    node: str
    shares: tuple[ShareRequest, ...]
    qos: QoS = "medium"
    isolation: Isolation = "soft"
    cause: UUID | None = None
    eviction_protection_s: int | None = None

    def __post_init__(self) -> None:
        _require_name("pool", self.pool)
        if self.eviction_protection_s is not None:
            _require_not_negative("eviction_protection_s", self.eviction_protection_s)
        _require_name("node", self.node)
        _require_name("workload.namespace", self.workload.namespace)
        _require_name("workload.name", self.workload.name)
        _require_one_of("qos", self.qos, QOS_LEVELS)
        _require_one_of("isolation", self.isolation, ISOLATION_MODES)
        if not self.shares:
            raise LedgerInputError("shares: empty; a reservation needs at least one GPU share")
        uuids = [share.gpu_uuid for share in self.shares]
        duplicates = sorted({uuid for uuid in uuids if uuids.count(uuid) > 1})
        if duplicates:
            raise LedgerInputError(
                f"shares: GPU {', '.join(duplicates)} appears more than once; give one share per GPU"
            )


@dataclass(frozen=True)
class ShareRecord:
    gpu_uuid: str
    tflops_milli: int
    vram_bytes: int
    limit_tflops_milli: int
    limit_vram_bytes: int


@dataclass(frozen=True)
class AllocationRecord:
    """One workload's allocation: its shares across GPUs and where it is in its life."""

    allocation_id: UUID
    workload: WorkloadRef
    pool: str
    node: str
    qos: QoS
    isolation: Isolation
    state: AllocationState
    shares: tuple[ShareRecord, ...]
    created_at: datetime
    committed_at: datetime | None
    released_at: datetime | None
    release_reason: str | None


@dataclass(frozen=True)
class PlacementFacts:
    """What a placement view is built from, read in one snapshot: every node and GPU (ordered by
    name, and by node then index) and every allocation not yet released (oldest first)."""

    nodes: list[NodeRecord]
    gpus: list[GpuRecord]
    allocations: list[AllocationRecord]


@dataclass(frozen=True)
class HistoryRecord:
    """One append-only history entry for one GPU share (billing and audits replay these)."""

    allocation_id: UUID
    gpu_uuid: str
    kind: HistoryKind
    occurred_at: datetime
    cause: UUID | None
    tflops_milli: int
    vram_bytes: int
    reason: str | None


@dataclass(frozen=True)
class Reserved:
    """The reservation is committed.

    `replayed`: this `allocation_id` already existed, so nothing changed; `allocation.state` says where
    it is now (it may have been released since).
    """

    allocation: AllocationRecord
    replayed: bool = False


@dataclass(frozen=True)
class InsufficientCapacity:
    """A GPU lacks room for its share; nothing was reserved on any GPU."""

    gpu_uuid: str
    resource: Resource
    requested: int
    available: int
    capacity: int

    @property
    def message(self) -> str:
        """E.g. `insufficient capacity on GPU gpu-1: VRAM requested 20Gi, free 8Gi of 80Gi`."""
        formatted = format_bytes if self.resource == "vram" else format_milli
        label = "VRAM" if self.resource == "vram" else "TFLOPS"
        return (
            f"insufficient capacity on GPU {self.gpu_uuid}: {label} requested {formatted(self.requested)}, "
            f"free {formatted(max(self.available, 0))} of {formatted(self.capacity)}"
        )


@dataclass(frozen=True)
class ReservationRejected:
    """The reservation names something the ledger cannot use (unknown GPU, GPU on another node,
    GPU not Running, unknown pool); nothing was reserved. `field` names the offending input."""

    field: str
    message: str


ReservationResult = Reserved | InsufficientCapacity | ReservationRejected


@dataclass(frozen=True)
class NamespaceShare:
    """One GPU share of an allocation not yet released, with its GPU's TFLOPS: what a namespace's quota
    usage is counted from (`SqlLedger.namespace_shares`, `SqlLedger.reserve_within_quota`)."""

    namespace: str
    allocation_id: UUID
    tflops_milli: int
    vram_bytes: int
    limit_tflops_milli: int
    limit_vram_bytes: int
    capacity_tflops_milli: int


@dataclass(frozen=True)
class QuotaHeld:
    """A reservation not made: the namespace's quota, checked in the reservation's own transaction,
    refused it; `reason` is the check's message."""

    reason: str


@dataclass(frozen=True)
class HoldFor:
    """Whom a capacity hold (a defrag planner's allocation) is kept for: the evicted pod's namespace and
    name and its controller owner's uid (None when it has none). Its replacement claims the hold."""

    pool: str
    namespace: str
    name: str
    owner_uid: str | None
    expires_at: datetime

    def __post_init__(self) -> None:
        _require_name("hold.pool", self.pool)
        _require_name("hold.namespace", self.namespace)
        _require_name("hold.name", self.name)
        _require_aware("hold.expires_at", self.expires_at)


@dataclass(frozen=True)
class HoldRecord:
    """An active capacity hold: its allocation (node and shares) and whom it is kept for."""

    allocation: AllocationRecord
    held_for: HoldFor


@dataclass(frozen=True)
class HeldShare:
    """One GPU share of an allocation and the interval it held capacity, from the allocation history:
    from its `opened` entry (`start`) to its `released` or `evicted` entry (`end`; None: still held).
    `workload` is the allocation's (`workload.workload`: the owning controller, when recorded);
    quantities are per GPU; `eviction_protection_s` is the allocation's, from the reservation (None:
    none). What billing prices (`Ledger.held_shares`)."""

    allocation_id: UUID
    gpu_uuid: str
    workload: WorkloadRef
    qos: QoS
    pool: str
    gpu_model: str
    request_tflops_milli: int
    request_vram_bytes: int
    limit_tflops_milli: int
    limit_vram_bytes: int
    eviction_protection_s: int | None
    start: datetime
    end: datetime | None


@dataclass(frozen=True)
class DefragCampaignSummary:
    """One defrag campaign (the planner's `defrag_campaign` row, revision `0004_defrag_campaigns`) as
    readers other than the planner see it, its node lists reduced to counts (`Ledger.latest_defrag_campaigns`,
    `Ledger.defrag_campaigns_since`)."""

    pool: str
    trigger: str
    running: bool
    started_at: datetime
    finished_at: datetime | None
    deadline_at: datetime | None
    outcome: str | None
    current_node: str | None
    nodes_drained: int
    nodes_failed: int
    nodes_skipped: int
    pods_evicted: int
    stranded_pods: int


@dataclass(frozen=True)
class PendingSubmission:
    """A workload the scheduler keeps pending (its `scheduler_workload` row, revision
    `0003_scheduler_workloads`) as readers other than the scheduler see it: the submission document as
    the scheduler stored it, its reason for waiting and when it was submitted
    (`Ledger.pending_workloads`)."""

    namespace: str
    name: str
    submission: Mapping[str, Any]
    reason: str | None
    submitted_at: datetime

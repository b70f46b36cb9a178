"""Placement model: nodes, GPUs and requests as frozen values, validated on construction.

Pure data with small derived properties. Quantities are integers: milli-CPU, bytes, milli-TFLOPS, and
GPU shares in thousandths of a card. Nothing here touches I/O, the clock or randomness.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

from tfcommon.pod_spec import MAX_GPU_COUNT

WHOLE_GPU_SHARE = 1000


class PlacementRequestError(ValueError):
    """A request or node that cannot be placed as given; `str()` names the field and the fix."""


class Isolation(StrEnum):
    """How a workload shares its GPUs (TensorFusion names)."""

    SHARED = "shared"
    SOFT = "soft"
    HARD = "hard"
    PARTITIONED = "partitioned"


@dataclass(frozen=True)
class Taint:
    """A node taint; `NoSchedule` and `NoExecute` repel requests that do not tolerate them."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True)
class Toleration:
    """A request's toleration, Kubernetes semantics: operator `Equal` (default) or `Exists`."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


@dataclass(frozen=True)
class NodeSelectorRequirement:
    """One match expression of a required node affinity term: `In`, `NotIn`, `Exists`,
    `DoesNotExist`, `Gt`, `Lt` against a node label."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key, "")
        if self.operator == "In":
            return present and value in self.values
        if self.operator == "NotIn":
            return not present or value not in self.values
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        if not present or not value.lstrip("-").isdigit() or not self.values:
            return False
        if self.operator == "Gt":
            return int(value) > int(self.values[0])
        return int(value) < int(self.values[0])


NODE_SELECTOR_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})


@dataclass(frozen=True)
class Gpu:
    """One GPU: identity, capacity and what is reserved on it (requests only, never limits)."""

    uuid: str
    index: int
    model: str
    tflops_milli: int
    vram_bytes: int
    vendor: str = "nvidia"
    used_tflops_milli: int = 0
    used_vram_bytes: int = 0
    workers: int = 0
    numa_node: int | None = None
    nvlink_peers: tuple[int, ...] = ()

    @property
    def free_tflops_milli(self) -> int:
        return self.tflops_milli - self.used_tflops_milli

    @property
    def free_vram_bytes(self) -> int:
        return self.vram_bytes - self.used_vram_bytes

    @property
    def is_idle(self) -> bool:
        return self.used_tflops_milli == 0 and self.used_vram_bytes == 0 and self.workers == 0

    @cached_property
    def free_share(self) -> int:
        """Free part of the card in thousandths (the smaller of free TFLOPS and free VRAM)."""
        if self.tflops_milli <= 0 or self.vram_bytes <= 0:
            return 0
        return min(
            self.free_tflops_milli * WHOLE_GPU_SHARE // self.tflops_milli,
            self.free_vram_bytes * WHOLE_GPU_SHARE // self.vram_bytes,
        )


@dataclass(frozen=True)
class Node:
    """A schedulable node: allocatable CPU and memory, what is reserved, its GPUs and its metadata.

    `workload_classes` counts the workloads hosted per class (see `PlacementRequest.workload_class`);
    the GPU-clustering policy reads it. `limit_tflops_milli`/`limit_vram_bytes` sum the limits of the
    workloads on the node; `virtual_tflops_milli`/`virtual_vram_bytes` (None: not checked) are the most
    those limits may add up to, the virtual capacity of an oversubscribed pool (`tfcommon.pool_capacity`).
    """

    name: str
    cpu_milli: int
    memory_bytes: int
    gpus: tuple[Gpu, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    cordoned: bool = False
    pool: str = "default"
    used_cpu_milli: int = 0
    used_memory_bytes: int = 0
    workers: int = 0
    workload_classes: tuple[tuple[str, int], ...] = ()
    limit_tflops_milli: int = 0
    limit_vram_bytes: int = 0
    virtual_tflops_milli: int | None = None
    virtual_vram_bytes: int | None = None

    def __post_init__(self) -> None:
        for position, gpu in enumerate(self.gpus):
            if gpu.index != position:
                raise PlacementRequestError(
                    f"node {self.name}: gpus[{position}].index is {gpu.index}; "
                    "list GPUs in index order 0..N-1"
                )

    @property
    def free_cpu_milli(self) -> int:
        return self.cpu_milli - self.used_cpu_milli

    @property
    def free_memory_bytes(self) -> int:
        return self.memory_bytes - self.used_memory_bytes

    @cached_property
    def shape_key(self) -> tuple[object, ...]:
        """Everything static about the node except its name: equal shapes behave identically."""
        return (
            self.cpu_milli,
            self.memory_bytes,
            tuple(sorted(self.labels.items())),
            self.taints,
            self.cordoned,
            self.pool,
            tuple(
                (g.model, g.vendor, g.tflops_milli, g.vram_bytes, g.numa_node, g.nvlink_peers)
                for g in self.gpus
            ),
            self.virtual_tflops_milli,
            self.virtual_vram_bytes,
        )

    @cached_property
    def state_key(self) -> tuple[object, ...]:
        """Shape plus everything reserved: two nodes with equal keys get equal filter and score results."""
        return (
            self.shape_key,
            self.used_cpu_milli,
            self.used_memory_bytes,
            self.workers,
            tuple((g.used_tflops_milli, g.used_vram_bytes, g.workers) for g in self.gpus),
            self.workload_classes,
            self.limit_tflops_milli if self.virtual_tflops_milli is not None else 0,
            self.limit_vram_bytes if self.virtual_vram_bytes is not None else 0,
        )

    @cached_property
    def free_shares(self) -> tuple[int, ...]:
        return tuple(g.free_share for g in self.gpus)


@dataclass(frozen=True)
class PlacementRequest:
    """What one workload asks for. Per-GPU demands apply to each of `gpu_count` GPUs on one node.

    Give the per-GPU demand as `tflops_milli` and/or `vram_bytes`, or `compute_percent` (of each
    GPU's TFLOPS, truncated to whole TFLOPS like TensorFusion) with `vram_bytes`, or `gpu_share`
    (thousandths of each GPU's TFLOPS and VRAM, as trace replays use). `gpu_count` 0 is a CPU-only
    request. `gpu_models` empty means any model; `shared` isolation takes whole idle cards.
    `limit_tflops_milli`/`limit_vram_bytes` are the per-GPU limits (never below what is reserved on
    the GPU), `limit_compute_percent` a limit in percent of each GPU; only a node with a virtual
    capacity checks them, and the reservation records them.
    """

    name: str
    cpu_milli: int = 0
    memory_bytes: int = 0
    gpu_count: int = 1
    tflops_milli: int = 0
    vram_bytes: int = 0
    compute_percent: int | None = None
    gpu_share: int | None = None
    isolation: Isolation = Isolation.SOFT
    gpu_models: frozenset[str] = frozenset()
    vendor: str | None = None
    gpu_indices: tuple[int, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    required_node_affinity: tuple[tuple[NodeSelectorRequirement, ...], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    pool: str | None = None
    qos: str = "medium"
    limit_tflops_milli: int = 0
    limit_vram_bytes: int = 0
    limit_compute_percent: int | None = None

    def __post_init__(self) -> None:
        _validate(self)

    @cached_property
    def key(self) -> tuple[object, ...]:
        """Everything that decides where the request fits and how it scores (not its name or QoS)."""
        return (
            self.cpu_milli,
            self.memory_bytes,
            self.gpu_count,
            self.tflops_milli,
            self.vram_bytes,
            self.compute_percent,
            self.gpu_share,
            self.isolation,
            tuple(sorted(self.gpu_models)),
            self.vendor,
            self.gpu_indices,
            tuple(sorted(self.node_selector.items())),
            self.required_node_affinity,
            self.tolerations,
            self.pool,
            self.limit_tflops_milli,
            self.limit_vram_bytes,
            self.limit_compute_percent,
        )

    @property
    def workload_class(self) -> str:
        """The GPU-demand class: `cpu`, `share` (part of one GPU), `N-gpu` (N whole GPUs), or
        `N-gpu-share` (part of each of N GPUs)."""
        if self.gpu_count == 0:
            return "cpu"
        whole = self.isolation is Isolation.SHARED or self.gpu_share == WHOLE_GPU_SHARE
        if whole:
            return f"{self.gpu_count}-gpu"
        return "share" if self.gpu_count == 1 else f"{self.gpu_count}-gpu-share"

    def tflops_on(self, gpu: Gpu) -> int:
        """Milli-TFLOPS this request reserves on `gpu`."""
        if self.isolation is Isolation.SHARED:
            return gpu.tflops_milli
        if self.gpu_share is not None:
            return self.gpu_share * gpu.tflops_milli // WHOLE_GPU_SHARE
        if self.compute_percent is not None:
            whole_tflops = self.compute_percent * gpu.tflops_milli // 100 // 1000
            return whole_tflops * 1000
        return self.tflops_milli

    def vram_on(self, gpu: Gpu) -> int:
        """VRAM bytes this request reserves on `gpu`."""
        if self.isolation is Isolation.SHARED:
            return gpu.vram_bytes
        if self.gpu_share is not None:
            return self.gpu_share * gpu.vram_bytes // WHOLE_GPU_SHARE
        return self.vram_bytes

    def limit_tflops_on(self, gpu: Gpu) -> int:
        """Milli-TFLOPS of limit this request holds on `gpu` (its limit, at least what it reserves); a
        limit in percent is that part of the GPU's TFLOPS (rounded down to a milli-TFLOPS)."""
        by_percent = (self.limit_compute_percent or 0) * gpu.tflops_milli // 100
        return max(self.limit_tflops_milli, by_percent, self.tflops_on(gpu))

    def limit_vram_on(self, gpu: Gpu) -> int:
        """VRAM bytes of limit this request holds on `gpu` (its limit, at least what it reserves)."""
        return max(self.limit_vram_bytes, self.vram_on(gpu))

    def share_on(self, gpu: Gpu) -> int:
        """The request's per-GPU demand on `gpu` in thousandths of that card (rounded up)."""
        if self.isolation is Isolation.SHARED:
            return WHOLE_GPU_SHARE
        if self.gpu_share is not None:
            return self.gpu_share
        if gpu.tflops_milli <= 0 or gpu.vram_bytes <= 0:
            return WHOLE_GPU_SHARE
        by_tflops = -(-self.tflops_on(gpu) * WHOLE_GPU_SHARE // gpu.tflops_milli)
        by_vram = -(-self.vram_on(gpu) * WHOLE_GPU_SHARE // gpu.vram_bytes)
        return max(by_tflops, by_vram)


_AMOUNTS = (
    "cpu_milli",
    "memory_bytes",
    "tflops_milli",
    "vram_bytes",
    "limit_tflops_milli",
    "limit_vram_bytes",
)


def _validate(request: PlacementRequest) -> None:
    def fail(field_name: str, problem: str, fix: str) -> PlacementRequestError:
        return PlacementRequestError(f"request {request.name!r}: {field_name} {problem}; {fix}")

    for name in _AMOUNTS:
        if getattr(request, name) < 0:
            raise fail(name, f"is {getattr(request, name)}", "use a value >= 0")
    if not 0 <= request.gpu_count <= MAX_GPU_COUNT:
        raise fail("gpu_count", f"is {request.gpu_count}", f"use 0 (CPU only) to {MAX_GPU_COUNT}")
    if request.gpu_share is not None and not 1 <= request.gpu_share <= WHOLE_GPU_SHARE:
        raise fail("gpu_share", f"is {request.gpu_share}", "use 1..1000 thousandths of a GPU")
    if request.limit_compute_percent is not None and not 0 <= request.limit_compute_percent <= 100:
        raise fail("limit_compute_percent", f"is {request.limit_compute_percent}", "use 0..100")
    if request.compute_percent is not None and not 1 <= request.compute_percent <= 100:
        raise fail("compute_percent", f"is {request.compute_percent}", "use 1..100")
    if request.gpu_share is not None and (
        request.compute_percent is not None or request.tflops_milli or request.vram_bytes
    ):
        raise fail("gpu_share", "is combined with TFLOPS, VRAM or compute_percent", "give one form only")
    if request.compute_percent is not None and request.tflops_milli:
        raise fail("compute_percent", "is combined with tflops_milli", "give TFLOPS or a percent, not both")
    if request.gpu_count > 0 and request.isolation is not Isolation.SHARED:
        has_demand = (
            request.gpu_share is not None
            or request.compute_percent is not None
            or request.tflops_milli > 0
            or request.vram_bytes > 0
        )
        if not has_demand:
            raise fail(
                "tflops_milli/vram_bytes",
                "are both 0 for a GPU request",
                "give per-GPU TFLOPS or VRAM, compute_percent, gpu_share, or isolation=shared",
            )
    if len(set(request.gpu_indices)) != len(request.gpu_indices) or any(i < 0 for i in request.gpu_indices):
        raise fail("gpu_indices", f"is {request.gpu_indices}", "list distinct indices >= 0")
    if request.gpu_indices and len(request.gpu_indices) < request.gpu_count:
        raise fail(
            "gpu_indices",
            f"lists {len(request.gpu_indices)} GPUs for gpu_count {request.gpu_count}",
            "pin at least gpu_count indices",
        )
    for term in request.required_node_affinity:
        for requirement in term:
            if requirement.operator not in NODE_SELECTOR_OPERATORS:
                raise fail(
                    "required_node_affinity",
                    f"uses operator {requirement.operator!r}",
                    f"use one of {', '.join(sorted(NODE_SELECTOR_OPERATORS))}",
                )

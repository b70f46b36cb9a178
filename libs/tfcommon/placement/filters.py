"""Filter plugins, one property each. Node filters see the node; GPU filters see one of its GPUs.

Each plugin's `reason` is the text counted in a rejection summary (`802 insufficient VRAM`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tfcommon.placement.model import Gpu, Isolation, Node, PlacementRequest

DEFAULT_MAX_WORKERS_PER_NODE = 256
NO_SCHEDULE_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


class IsolationSupported:
    """Refuses `partitioned` isolation, which is not supported yet."""

    name: ClassVar[str] = "IsolationSupported"
    reason: ClassVar[str] = "partitioned isolation not supported yet"

    def admits(self, request: PlacementRequest, node: Node) -> bool:
        return request.isolation is not Isolation.PARTITIONED


class NodeSchedulable:
    """Skips cordoned nodes (and nodes the scheduler blocks, which it presents as cordoned)."""

    name: ClassVar[str] = "NodeSchedulable"
    reason: ClassVar[str] = "node cordoned"

    def admits(self, request: PlacementRequest, node: Node) -> bool:
        return not node.cordoned


class MatchesPool:
    """Keeps the request in its GPU pool when it names one."""

    name: ClassVar[str] = "MatchesPool"
    reason: ClassVar[str] = "other GPU pool"

    def admits(self, request: PlacementRequest, node: Node) -> bool:
        return request.pool is None or request.pool == node.pool


class MatchesNodeSelector:
    """Every `node_selector` label must be on the node with the same value."""

    name: ClassVar[str] = "MatchesNodeSelector"
    reason: ClassVar[str] = "node selector mismatch"

    def admits(self, request: PlacementRequest, node: Node) -> bool:
        return all(node.labels.get(key) == value for key, value in request.node_selector.items())


class MatchesNodeAffinity:
    """Required node affinity: one of the terms must match all of its expressions."""

    name: ClassVar[str] = "MatchesNodeAffinity"
    reason: ClassVar[str] = "node affinity mismatch"

    def admits(self, request: PlacementRequest, node: Node) -> bool:
        if not request.required_node_affinity:
            return True
        return any(
            all(requirement.matches(node.labels) for requirement in term)
            for term in request.required_node_affinity
        )


class ToleratesTaints:
    """Every `NoSchedule`/`NoExecute` taint needs a matching toleration."""

    name: ClassVar[str] = "ToleratesTaints"
    reason: ClassVar[str] = "untolerated taint"

    def admits(self, request: PlacementRequest, node: Node) -> bool:
        return all(
            any(toleration.tolerates(taint) for toleration in request.tolerations)
            for taint in node.taints
            if taint.effect in NO_SCHEDULE_EFFECTS
        )


class FitsCpu:
    """The request's CPU fits in what the node has left."""

    name: ClassVar[str] = "FitsCpu"
    reason: ClassVar[str] = "insufficient CPU"

    def admits(self, request: PlacementRequest, node: Node) -> bool:
        return request.cpu_milli <= node.cpu_milli - node.used_cpu_milli


class FitsMemory:
    """The request's memory fits in what the node has left."""

    name: ClassVar[str] = "FitsMemory"
    reason: ClassVar[str] = "insufficient memory"

    def admits(self, request: PlacementRequest, node: Node) -> bool:
        return request.memory_bytes <= node.memory_bytes - node.used_memory_bytes


class FitsVirtualCapacity:
    """On a node with a virtual capacity (an oversubscribed pool), the limits of its workloads and of
    the request together stay within it. Sized on the node's largest GPU, so never optimistic."""

    name: ClassVar[str] = "FitsVirtualCapacity"
    reason: ClassVar[str] = "limits over the pool's oversubscription"

    def admits(self, request: PlacementRequest, node: Node) -> bool:
        if request.gpu_count == 0 or not node.gpus:
            return True
        if node.virtual_tflops_milli is not None:
            most = max(request.limit_tflops_on(gpu) for gpu in node.gpus)
            if node.limit_tflops_milli + most * request.gpu_count > node.virtual_tflops_milli:
                return False
        if node.virtual_vram_bytes is not None:
            most = max(request.limit_vram_on(gpu) for gpu in node.gpus)
            if node.limit_vram_bytes + most * request.gpu_count > node.virtual_vram_bytes:
                return False
        return True


@dataclass(frozen=True)
class MaxWorkersPerNode:
    """TensorFusion's `maxWorkerPerNode` (default 256)."""

    limit: int = DEFAULT_MAX_WORKERS_PER_NODE
    name: ClassVar[str] = "MaxWorkersPerNode"
    reason: ClassVar[str] = "too many workers on node"

    def admits(self, request: PlacementRequest, node: Node) -> bool:
        return node.workers < self.limit


class MatchesGpuModel:
    """The GPU is one of the allowed models (any when none are given)."""

    name: ClassVar[str] = "MatchesGpuModel"
    reason: ClassVar[str] = "wrong GPU model"

    def applies(self, request: PlacementRequest) -> bool:
        return bool(request.gpu_models)

    def admits(self, request: PlacementRequest, node: Node, gpu: Gpu) -> bool:
        return not request.gpu_models or gpu.model in request.gpu_models


class MatchesGpuVendor:
    """The GPU comes from the requested vendor (any when none is given)."""

    name: ClassVar[str] = "MatchesGpuVendor"
    reason: ClassVar[str] = "wrong GPU vendor"

    def applies(self, request: PlacementRequest) -> bool:
        return request.vendor is not None

    def admits(self, request: PlacementRequest, node: Node, gpu: Gpu) -> bool:
        return request.vendor is None or gpu.vendor == request.vendor


class SharedTakesIdleGpu:
    """`shared` isolation takes only a completely idle card."""

    name: ClassVar[str] = "SharedTakesIdleGpu"
    reason: ClassVar[str] = "no idle GPU for shared isolation"

    def applies(self, request: PlacementRequest) -> bool:
        return request.isolation is Isolation.SHARED

    def admits(self, request: PlacementRequest, node: Node, gpu: Gpu) -> bool:
        return request.isolation is not Isolation.SHARED or gpu.is_idle


class FitsTflops:
    """The per-GPU TFLOPS fit in what the GPU has left."""

    name: ClassVar[str] = "FitsTflops"
    reason: ClassVar[str] = "insufficient TFLOPS"

    def applies(self, request: PlacementRequest) -> bool:
        return True

    def admits(self, request: PlacementRequest, node: Node, gpu: Gpu) -> bool:
        return request.tflops_on(gpu) <= gpu.tflops_milli - gpu.used_tflops_milli


class FitsVram:
    """The per-GPU VRAM fits in what the GPU has left."""

    name: ClassVar[str] = "FitsVram"
    reason: ClassVar[str] = "insufficient VRAM"

    def applies(self, request: PlacementRequest) -> bool:
        return True

    def admits(self, request: PlacementRequest, node: Node, gpu: Gpu) -> bool:
        return request.vram_on(gpu) <= gpu.vram_bytes - gpu.used_vram_bytes

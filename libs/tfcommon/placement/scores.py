"""Score plugins: TensorFusion's placement modes and the FGD paper's baselines, one rule each.

Every plugin ranks a feasible node from its state alone (results are memoized by node state).
Shares are thousandths of a GPU; CPU in milli.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tfcommon.placement.framework import NodeScore
from tfcommon.placement.model import WHOLE_GPU_SHARE, Gpu, Isolation, Node, PlacementRequest

TF_VRAM_WEIGHT = 0.7
TF_TFLOPS_WEIGHT = 0.3


class LeastFreeGpus:
    """Picks the candidate GPUs with the least free share first (bin-packing inside the node)."""

    name: ClassVar[str] = "LeastFreeGpus"

    def pick(self, request: PlacementRequest, node: Node, candidates: tuple[int, ...]) -> tuple[int, ...]:
        ordered = sorted(candidates, key=lambda i: (node.gpus[i].free_share, i))
        return tuple(sorted(ordered[: request.gpu_count]))


def _is_fractional(request: PlacementRequest, node: Node, candidates: tuple[int, ...]) -> bool:
    if request.gpu_count != 1 or request.isolation is Isolation.SHARED or not candidates:
        return False
    return request.share_on(node.gpus[candidates[0]]) < WHOLE_GPU_SHARE


def _tf_gpu_score(gpu: Gpu, *, used: bool) -> float:
    if gpu.tflops_milli <= 0 or gpu.vram_bytes <= 0:
        return 0.0
    vram_pct = 100 * gpu.used_vram_bytes / gpu.vram_bytes
    tflops_pct = 100 * gpu.used_tflops_milli / gpu.tflops_milli
    if not used:
        vram_pct, tflops_pct = 100 - vram_pct, 100 - tflops_pct
    return round(TF_VRAM_WEIGHT * vram_pct + TF_TFLOPS_WEIGHT * tflops_pct)


class _TensorFusionMode:
    node_prefers_used: ClassVar[bool]
    gpu_prefers_used: ClassVar[bool]
    normalize: ClassVar[bool] = False

    def score(self, request: PlacementRequest, node: Node, candidates: tuple[int, ...]) -> NodeScore:
        if not node.gpus:
            return NodeScore(0.0, ())
        node_score = sum(_tf_gpu_score(g, used=self.node_prefers_used) for g in node.gpus) / len(node.gpus)
        ranked = sorted(
            candidates, key=lambda i: (-_tf_gpu_score(node.gpus[i], used=self.gpu_prefers_used), i)
        )
        return NodeScore(float(round(node_score)), tuple(sorted(ranked[: request.gpu_count])))


class CompactFirst(_TensorFusionMode):
    """Pack nodes and pack GPUs: higher used share of VRAM (0.7) and TFLOPS (0.3) scores higher."""

    name: ClassVar[str] = "CompactFirst"
    node_prefers_used = True
    gpu_prefers_used = True


class LowLoadFirst(_TensorFusionMode):
    """Spread across nodes and GPUs: more available scores higher."""

    name: ClassVar[str] = "LowLoadFirst"
    node_prefers_used = False
    gpu_prefers_used = False


class NodeCompactGpuLowLoad(_TensorFusionMode):
    """TensorFusion's default: pack nodes, spread across the GPUs of the chosen node."""

    name: ClassVar[str] = "NodeCompactGPULowLoad"
    node_prefers_used = True
    gpu_prefers_used = False


def _gpu_demand(request: PlacementRequest, node: Node, gpus: tuple[int, ...]) -> int:
    return sum(request.share_on(node.gpus[i]) for i in gpus)


@dataclass(frozen=True)
class BestFit:
    """Least weighted leftover after placement: CPU 0.5, GPU 0.5, each divided by the largest node's."""

    max_cpu_milli: int = 128_000
    max_gpu_share: int = 8 * WHOLE_GPU_SHARE
    name: ClassVar[str] = "BestFit"
    normalize: ClassVar[bool] = True

    def score(self, request: PlacementRequest, node: Node, candidates: tuple[int, ...]) -> NodeScore:
        gpus = LeastFreeGpus().pick(request, node, candidates) if request.gpu_count else ()
        cpu_left = node.free_cpu_milli - request.cpu_milli
        gpu_left = sum(node.free_shares) - _gpu_demand(request, node, gpus)
        leftover = 0.5 * cpu_left / self.max_cpu_milli + 0.5 * gpu_left / self.max_gpu_share
        return NodeScore(float(int((1.0 - leftover) * 100)), gpus)


@dataclass(frozen=True)
class DotProduct:
    """Tetris-like alignment: the smallest dot product of normalized free and requested resources.

    For a fractional request the GPU dimension is the chosen GPU's free share, otherwise the node's.
    """

    max_cpu_milli: int = 128_000
    max_gpu_share: int = 8 * WHOLE_GPU_SHARE
    name: ClassVar[str] = "DotProduct"
    normalize: ClassVar[bool] = True

    def score(self, request: PlacementRequest, node: Node, candidates: tuple[int, ...]) -> NodeScore:
        cpu_term = (request.cpu_milli / self.max_cpu_milli) * (node.free_cpu_milli / self.max_cpu_milli)
        if _is_fractional(request, node, candidates):
            best: tuple[float, int] | None = None
            for i in candidates:
                share = request.share_on(node.gpus[i])
                dot = cpu_term + (share / WHOLE_GPU_SHARE) * (node.gpus[i].free_share / WHOLE_GPU_SHARE)
                if best is None or dot < best[0]:
                    best = (dot, i)
            assert best is not None
            return NodeScore(float(int((1.0 - best[0] / 2) * 100)), (best[1],))
        gpus = LeastFreeGpus().pick(request, node, candidates) if request.gpu_count else ()
        demand = _gpu_demand(request, node, gpus)
        dot = cpu_term + (demand / self.max_gpu_share) * (sum(node.free_shares) / self.max_gpu_share)
        return NodeScore(float(int((1.0 - dot / 2) * 100)), gpus)


class GpuPacking:
    """Prefer sharing a used GPU (the less it has left, the better), then a node that is already in use
    (the fewer idle GPUs it must break, the better), then an idle node (smaller first). Scores are
    whole numbers in three bands, 50-100, 33-50 and 0-33, so ties are common; CPU-only requests score 0.
    """

    name: ClassVar[str] = "GpuPacking"
    normalize: ClassVar[bool] = False

    def score(self, request: PlacementRequest, node: Node, candidates: tuple[int, ...]) -> NodeScore:
        if request.gpu_count == 0:
            return NodeScore(0.0, ())
        gpus = LeastFreeGpus().pick(request, node, candidates)
        idle_gpus = sum(1 for free in node.free_shares if free == WHOLE_GPU_SHARE)
        if idle_gpus == len(node.gpus):
            return NodeScore(float(max(33 - idle_gpus, idle_gpus)), gpus)
        idle_taken = sum(1 for i in gpus if node.gpus[i].free_share == WHOLE_GPU_SHARE)
        if idle_taken:
            return NodeScore(float(max(50 - idle_taken, 33)), gpus)
        free_percent = sum(node.gpus[i].free_share * 100 // WHOLE_GPU_SHARE for i in gpus)
        return NodeScore(float(max(100 - free_percent // 10, 50)), gpus)


@dataclass(frozen=True)
class GpuClustering:
    """Keep GPU workloads of one class together. Bands of 25: nodes hosting only the request's class,
    then nodes hosting it among others, then idle nodes, then nodes hosting other classes; inside a
    band, less free GPU (relative to the largest node) scores higher. CPU-only requests score 0."""

    max_gpu_share: int = 8 * WHOLE_GPU_SHARE
    name: ClassVar[str] = "GpuClustering"
    normalize: ClassVar[bool] = False

    def score(self, request: PlacementRequest, node: Node, candidates: tuple[int, ...]) -> NodeScore:
        if request.gpu_count == 0:
            return NodeScore(0.0, ())
        hosted = {workload_class for workload_class, _ in node.workload_classes if workload_class != "cpu"}
        own = request.workload_class
        bands = {(True, True): 3, (True, False): 2, (False, True): 1, (False, False): 0}
        band = bands[own in hosted, hosted <= {own}]
        used = self.max_gpu_share - sum(node.free_shares)
        within = 25 * used // self.max_gpu_share
        return NodeScore(float(25 * band + within), LeastFreeGpus().pick(request, node, candidates))


class Indifferent:
    """Scores every feasible node alike; with a seeded profile this is the paper's Random-fit."""

    name: ClassVar[str] = "Indifferent"
    normalize: ClassVar[bool] = False

    def score(self, request: PlacementRequest, node: Node, candidates: tuple[int, ...]) -> NodeScore:
        return NodeScore(0.0)

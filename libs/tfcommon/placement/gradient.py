"""Fragmentation-gradient scoring: place where the expected fragmentation grows least (FGD).

`FragmentationGradient` follows the paper's rule: for each way to place the request on a node
(each fitting GPU for a fractional request), hypothetically place it, take
delta = F_n(M) before - after, and score int(sigmoid(delta / 1000) * 100); the best GPU wins,
the lowest index on ties. Whole-GPU and multi-GPU requests take the GPUs with the least free
share. `memory_aware=True` also counts GPUs stranded by missing memory (our default policy, with a
target workload built `with_memory`).
"""

from __future__ import annotations

import math
from typing import ClassVar

from tfcommon.placement.fragmentation import GpuState, TargetWorkload, node_fragment, node_gpu_states
from tfcommon.placement.framework import NodeScore
from tfcommon.placement.model import WHOLE_GPU_SHARE, Isolation, Node, PlacementRequest
from tfcommon.placement.scores import LeastFreeGpus

FRAGMENT_MEMO_LIMIT = 500_000


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


class FragmentationGradient:
    """FGD's score plugin over a target workload; memoizes F_n(M) by (free CPU, GPU states)."""

    name: ClassVar[str] = "FragmentationGradient"
    normalize: ClassVar[bool] = False

    def __init__(self, target: TargetWorkload, *, memory_aware: bool = False) -> None:
        self.target = target
        self.memory_aware = memory_aware
        self._fragments: dict[tuple[int, int | None, tuple[GpuState, ...]], float] = {}

    def fragment(
        self, free_cpu_milli: int, free_memory_bytes: int | None, gpus: tuple[GpuState, ...]
    ) -> float:
        key = (free_cpu_milli, free_memory_bytes, gpus)
        cached = self._fragments.get(key)
        if cached is None:
            if len(self._fragments) > FRAGMENT_MEMO_LIMIT:
                self._fragments.clear()
            cached = node_fragment(free_cpu_milli, gpus, self.target, free_memory_bytes)
            self._fragments[key] = cached
        return cached

    def node_fragment(self, node: Node) -> float:
        """F_n(M) of the node as it stands (memory counted when memory-aware)."""
        memory = node.free_memory_bytes if self.memory_aware else None
        return self.fragment(node.free_cpu_milli, memory, node_gpu_states(node))

    @staticmethod
    def _score(delta: float) -> float:
        return float(int(sigmoid(delta / WHOLE_GPU_SHARE) * 100))

    def score(self, request: PlacementRequest, node: Node, candidates: tuple[int, ...]) -> NodeScore:
        gpus = node_gpu_states(node)
        memory = node.free_memory_bytes if self.memory_aware else None
        memory_after = None if memory is None else memory - request.memory_bytes
        before = self.fragment(node.free_cpu_milli, memory, gpus)
        cpu_after = node.free_cpu_milli - request.cpu_milli
        if request.gpu_count == 0:
            return NodeScore(self._score(before - self.fragment(cpu_after, memory_after, gpus)), ())
        fractional = (
            request.gpu_count == 1
            and request.isolation is not Isolation.SHARED
            and request.share_on(node.gpus[candidates[0]]) < WHOLE_GPU_SHARE
        )
        if fractional:
            best: tuple[float, int] | None = None
            tried: set[GpuState] = set()
            for i in candidates:
                if gpus[i] in tried:
                    continue
                tried.add(gpus[i])
                after = list(gpus)
                model, free = gpus[i]
                after[i] = (model, free - request.share_on(node.gpus[i]))
                value = self._score(before - self.fragment(cpu_after, memory_after, tuple(after)))
                if best is None or value > best[0]:
                    best = (value, i)
            assert best is not None
            return NodeScore(best[0], (best[1],))
        chosen = LeastFreeGpus().pick(request, node, candidates)
        after = list(gpus)
        for i in chosen:
            model, free = gpus[i]
            after[i] = (model, free - request.share_on(node.gpus[i]))
        return NodeScore(self._score(before - self.fragment(cpu_after, memory_after, tuple(after))), chosen)

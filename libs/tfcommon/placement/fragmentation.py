"""GPU fragmentation as the FGD paper (Weng et al., USENIX ATC '23) defines it.

A target workload is a set of task classes with popularities. A node's fragment for one class is
the free GPU share it cannot use for that class: when the class fits (enough usable GPUs with
enough free share, and enough CPU), the free share of the GPUs too small for it; otherwise all of
the node's free GPU share. The node's fragmentation is the popularity-weighted sum. Shares are in
thousandths of a GPU. Pure functions; memoization lives in the callers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

from tfcommon.placement.model import WHOLE_GPU_SHARE, Isolation, Node, PlacementRequest

GpuState = tuple[str, int]
"""One GPU as fragmentation sees it: its model and its free share."""


@dataclass(frozen=True)
class WorkloadClass:
    """One kind of task: CPU, GPU count, per-GPU share, the models it may use (empty: any), and the
    memory it needs (0 unless the target workload was built `with_memory`)."""

    cpu_milli: int
    gpu_count: int
    gpu_share: int
    gpu_models: frozenset[str] = frozenset()
    memory_bytes: int = 0

    @classmethod
    def of(cls, request: PlacementRequest) -> WorkloadClass:
        """The class of a share-based request (TFLOPS/VRAM requests count as whole GPUs)."""
        if request.gpu_count == 0:
            share = 0
        elif request.gpu_share is not None and request.isolation is not Isolation.SHARED:
            share = request.gpu_share
        else:
            share = WHOLE_GPU_SHARE
        return cls(request.cpu_milli, request.gpu_count, share, request.gpu_models)


@dataclass(frozen=True)
class TargetWorkload:
    """Task classes and their popularities (summing to 1)."""

    classes: tuple[tuple[WorkloadClass, float], ...]

    @cached_property
    def fragment_plan(
        self,
    ) -> tuple[tuple[tuple[int, frozenset[str]], ...], tuple[tuple[int, int, int, int, float], ...]]:
        """The classes as `node_fragment` walks them: the distinct (share, models) they need, and per
        class (index of its need, GPU count, CPU, memory, popularity), in order."""
        needs: dict[tuple[int, frozenset[str]], int] = {}
        plan = []
        for workload_class, popularity in self.classes:
            need = needs.setdefault((workload_class.gpu_share, workload_class.gpu_models), len(needs))
            plan.append(
                (
                    need,
                    workload_class.gpu_count,
                    workload_class.cpu_milli,
                    workload_class.memory_bytes,
                    popularity,
                )
            )
        return tuple(needs), tuple(plan)

    @classmethod
    def from_requests(
        cls, requests: Iterable[PlacementRequest], coverage: float = 0.95, *, with_memory: bool = False
    ) -> TargetWorkload:
        """The most popular classes that together cover `coverage` of the requests, renormalized
        (the FGD paper keeps 95%). `with_memory` gives each class the median memory of its requests,
        so that fragmentation can also count GPUs stranded by missing memory.

        Ties in popularity are ordered by the class fields so the result does not depend on input order.
        """
        memories: dict[WorkloadClass, list[int]] = {}
        for request in requests:
            memories.setdefault(WorkloadClass.of(request), []).append(request.memory_bytes)
        return cls.from_classes(memories, coverage, with_memory=with_memory)

    @classmethod
    def from_classes(
        cls,
        memories: Mapping[WorkloadClass, Sequence[int]],
        coverage: float = 0.95,
        *,
        with_memory: bool = False,
    ) -> TargetWorkload:
        """`from_requests` for requests already sorted into classes: each class with the memory of each
        of its requests (a caller that keeps a sliding window of requests keeps this up to date)."""
        total = sum(len(values) for values in memories.values())
        if total == 0:
            return cls(())
        ordered = sorted(
            memories.items(),
            key=lambda item: (
                -len(item[1]),
                item[0].cpu_milli,
                item[0].gpu_count,
                item[0].gpu_share,
                sorted(item[0].gpu_models),
            ),
        )
        kept: list[tuple[WorkloadClass, int]] = []
        covered = 0
        for workload_class, values in ordered:
            if covered >= coverage * total:
                break
            if with_memory:
                workload_class = replace(workload_class, memory_bytes=sorted(values)[(len(values) - 1) // 2])
            kept.append((workload_class, len(values)))
            covered += len(values)
        return cls(tuple((workload_class, count / covered) for workload_class, count in kept))


def node_gpu_states(node: Node) -> tuple[GpuState, ...]:
    return tuple((gpu.model, gpu.free_share) for gpu in node.gpus)


def class_fragment(
    free_cpu_milli: int,
    gpus: Sequence[GpuState],
    workload_class: WorkloadClass,
    free_memory_bytes: int | None = None,
) -> int:
    """F_n(m): the free GPU share of the node that task class `m` cannot use. With `free_memory_bytes`
    given, a class whose memory does not fit cannot use any of it either."""
    total_free = 0
    usable_free = 0
    usable_count = 0
    models = workload_class.gpu_models
    share = workload_class.gpu_share
    for model, free in gpus:
        total_free += free
        if free >= share and (not models or model in models):
            usable_count += 1
            usable_free += free
    fits = (
        workload_class.gpu_count > 0
        and usable_count >= workload_class.gpu_count
        and free_cpu_milli >= workload_class.cpu_milli
        and (free_memory_bytes is None or free_memory_bytes >= workload_class.memory_bytes)
    )
    return total_free - usable_free if fits else total_free


def node_fragment(
    free_cpu_milli: int,
    gpus: Sequence[GpuState],
    target: TargetWorkload,
    free_memory_bytes: int | None = None,
) -> float:
    """F_n(M): the node's expected fragment (in thousandths of a GPU) under the target workload.

    The same sum as `class_fragment` over the classes, in the same order; the GPUs a class could use
    are counted once per (share, models) that classes have in common."""
    total_free = 0
    for _model, free in gpus:
        total_free += free
    needs, plan = target.fragment_plan
    usable_count = [-1] * len(needs)
    usable_free = [0] * len(needs)
    fragment: float = 0
    for need, gpu_count, cpu_milli, memory_bytes, popularity in plan:
        count = usable_count[need]
        if count < 0:
            share, models = needs[need]
            count = free_sum = 0
            for model, free in gpus:
                if free >= share and (not models or model in models):
                    count += 1
                    free_sum += free
            usable_count[need] = count
            usable_free[need] = free_sum
        if (
            gpu_count > 0
            and count >= gpu_count
            and free_cpu_milli >= cpu_milli
            and (free_memory_bytes is None or free_memory_bytes >= memory_bytes)
        ):
            fragment += popularity * (total_free - usable_free[need])
        else:
            fragment += popularity * total_free
    return fragment


@dataclass(frozen=True)
class FragmentationReport:
    """Cluster fragment (thousandths of a GPU), idle GPU share, and their ratio (0 when nothing idle)."""

    fragment: float
    idle: int
    capacity: int

    @property
    def rate(self) -> float:
        return self.fragment / self.idle if self.idle else 0.0

    @property
    def share_of_capacity(self) -> float:
        return self.fragment / self.capacity if self.capacity else 0.0


def cluster_fragmentation(nodes: Iterable[Node], target: TargetWorkload) -> FragmentationReport:
    fragment = 0.0
    idle = 0
    capacity = 0
    for node in nodes:
        gpus = node_gpu_states(node)
        fragment += node_fragment(node.free_cpu_milli, gpus, target)
        idle += sum(free for _, free in gpus)
        capacity += WHOLE_GPU_SHARE * len(gpus)
    return FragmentationReport(fragment, idle, capacity)

"""Rollout look-ahead: weigh the best few nodes for a request by playing the next few pods forward.

For a request, the profile ranks the feasible nodes as usual; the `candidates` best (one per node
state) are each tried in turn: reserve the request there, then place `depth` pods drawn from the target
workload, each greedily where the profile would put it, and sum how much FGD's fragment F_n(M) of the
nodes touched grew. The candidate with the least growth wins; ties keep the profile's order. The draws
are the same for every candidate of one decision and come from a hash of the seed and the request
name, so the choice is deterministic. Nothing is reserved in the view: the rollout works on copies of
the touched nodes, and reads the view's ranking of each drawn shape for the nodes it did not touch
(a node state whose first node by name was touched is passed over there, a small approximation).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from tfcommon.placement.fragmentation import TargetWorkload, WorkloadClass
from tfcommon.placement.framework import Candidate, ClusterView, Profile
from tfcommon.placement.model import Gpu, Node, PlacementRequest

DEFAULT_CANDIDATES = 4
DEFAULT_DEPTH = 8

NodeMeasure = Callable[[Node], float]
"""A node's fragment under the target workload (thousandths of a GPU); lower is better."""


def sample_request(workload_class: WorkloadClass, name: str) -> PlacementRequest:
    """A request of one task class (per-GPU share of each of its GPUs, its CPU and memory)."""
    return PlacementRequest(
        name=name,
        cpu_milli=workload_class.cpu_milli,
        memory_bytes=workload_class.memory_bytes,
        gpu_count=workload_class.gpu_count,
        gpu_share=workload_class.gpu_share if workload_class.gpu_count else None,
        gpu_models=workload_class.gpu_models if workload_class.gpu_count else frozenset(),
    )


@dataclass(frozen=True)
class _Move:
    node: Node
    gpus: tuple[int, ...]


class Rollout:
    """The rollout chooser (see the module docstring): `candidates` nodes, `depth` drawn pods."""

    name: ClassVar[str] = "Rollout"

    def __init__(
        self,
        measure: NodeMeasure,
        target: TargetWorkload,
        *,
        seed: int = 0,
        candidates: int = DEFAULT_CANDIDATES,
        depth: int = DEFAULT_DEPTH,
    ) -> None:
        self.measure = measure
        self.seed = seed
        self.candidates = candidates
        self.depth = depth
        self._samples = tuple(
            sample_request(workload_class, f"rollout-{position}")
            for position, (workload_class, _popularity) in enumerate(target.classes)
        )
        self._weights = tuple(popularity for _class, popularity in target.classes)

    def draws(self, request: PlacementRequest) -> list[PlacementRequest]:
        """The pods played after `request`: `depth` draws from the target workload, seeded."""
        if not self._samples:
            return []
        rng = random.Random(f"rollout/{self.seed}/{request.name}")
        return rng.choices(self._samples, self._weights, k=self.depth)

    def choose(
        self, request: PlacementRequest, view: ClusterView, profile: Profile, ranked: Sequence[Candidate]
    ) -> int:
        draws = self.draws(request)
        if not draws:
            return 0
        best: tuple[float, int] | None = None
        for position, candidate in enumerate(ranked):
            growth = self._growth(request, candidate, draws, view, profile)
            if best is None or growth < best[0]:
                best = (growth, position)
        assert best is not None
        return best[1]

    def _growth(
        self,
        request: PlacementRequest,
        candidate: Candidate,
        draws: Sequence[PlacementRequest],
        view: ClusterView,
        profile: Profile,
    ) -> float:
        touched: dict[str, Node] = {}
        start = view.nodes[candidate.node]
        touched[candidate.node] = _reserved(start, request, candidate.gpus)
        for drawn in draws:
            move = self._greedy(drawn, touched, view, profile)
            if move is not None:
                touched[move.node.name] = _reserved(move.node, drawn, move.gpus)
        return sum(self.measure(node) - self.measure(view.nodes[name]) for name, node in touched.items())

    def _greedy(
        self, request: PlacementRequest, touched: dict[str, Node], view: ClusterView, profile: Profile
    ) -> _Move | None:
        """Where the profile would put `request` if the touched nodes were in their rollout state."""
        best: tuple[tuple[float, str], _Move] | None = None
        for name, node in touched.items():
            outcome = view.outcome(profile, request, node)
            if isinstance(outcome, Candidate):
                rank = (-outcome.total, name)
                if best is None or rank < best[0]:
                    best = (rank, _Move(node, outcome.gpus))
        for candidate in view.best(profile, request, len(touched) + 1):
            if candidate.node in touched:
                continue
            rank = (-candidate.total, candidate.node)
            if best is None or rank < best[0]:
                best = (rank, _Move(view.nodes[candidate.node], candidate.gpus))
            break
        return None if best is None else best[1]


def _reserved(node: Node, request: PlacementRequest, gpu_indices: tuple[int, ...]) -> Node:
    gpus: list[Gpu] = list(node.gpus)
    for index in gpu_indices:
        gpu = gpus[index]
        gpus[index] = replace(
            gpu,
            used_tflops_milli=gpu.used_tflops_milli + request.tflops_on(gpu),
            used_vram_bytes=gpu.used_vram_bytes + request.vram_on(gpu),
            workers=gpu.workers + 1,
        )
    return replace(
        node,
        gpus=tuple(gpus),
        used_cpu_milli=node.used_cpu_milli + request.cpu_milli,
        used_memory_bytes=node.used_memory_bytes + request.memory_bytes,
        workers=node.workers + 1,
    )

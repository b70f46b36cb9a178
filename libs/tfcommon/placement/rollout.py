"""Rollout look-ahead: weigh the best few nodes for a request by playing the next few pods forward.

For a request, the profile ranks the feasible nodes as usual; the `candidates` best (one per node
state) are each tried in turn: reserve the request there, then place `depth` pods drawn from the target
workload, each greedily where the profile would put it, and sum how much the node measure of the nodes
touched grew (in the default policy, the card values of card_value.py: the GPU share expected to stay
idle for good). The candidate with the least growth wins; ties keep the profile's order. The draws
are the same for every candidate of one decision and come from a hash of the seed and the request
name, so the choice is deterministic. Nothing is reserved in the view: the rollout works on copies of
the touched nodes, and reads the view's ranking of each drawn shape for the nodes it did not touch
(a node state whose first node by name was touched is passed over there, a small approximation).

The draws are played once without the request (the shared path); a candidate's rollout follows it,
evaluating only its own reserved node, until a draw would land on the candidate's node or rather take
its reserved state, and is played on its own from there, so the choice is the one that rollouts
played one candidate at a time would make. CPU-only requests are not weighed (the profile's first
node): the rollout almost never changed their node.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import ClassVar, TypeVar

from tfcommon.placement.fragmentation import TargetWorkload, WorkloadClass
from tfcommon.placement.framework import Candidate, ClusterView, Profile
from tfcommon.placement.model import Gpu, Node, PlacementRequest

DEFAULT_CANDIDATES = 4
DEFAULT_DEPTH = 6

_Frozen = TypeVar("_Frozen", Gpu, Node)

NodeMeasure = Callable[[Node], float]
"""How much GPU share a node wastes (thousandths of a GPU), e.g. its expected idle share for good or
FGD's fragment under the target workload; lower is better."""


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
        if request.gpu_count == 0:
            return 0
        draws = self.draws(request)
        if not draws:
            return 0
        rankings = _Rankings(view, profile)
        shared = self._shared_path(draws, view, profile, rankings)
        best: tuple[float, int] | None = None
        for position, candidate in enumerate(ranked):
            growth = self._growth(request, candidate, draws, view, profile, shared, rankings)
            if best is None or growth < best[0]:
                best = (growth, position)
        assert best is not None
        return best[1]

    def _shared_path(
        self, draws: Sequence[PlacementRequest], view: ClusterView, profile: Profile, rankings: _Rankings
    ) -> list[_Step]:
        """The draws played greedily without the request. A candidate's rollout is the same until a draw
        would land on the candidate's node, or would rather take the candidate's reserved state: the
        draws up to there are shared, not played again per candidate."""
        touched: dict[str, Node] = {}
        steps: list[_Step] = []
        for drawn in draws:
            choice = self._greedy(drawn, touched, view, profile, rankings)
            steps.append(_Step(dict(touched), choice))
            if choice is not None:
                move = choice[1]
                touched[move.node.name] = _reserved(move.node, drawn, move.gpus)
        steps.append(_Step(touched, None))
        return steps

    def _growth(
        self,
        request: PlacementRequest,
        candidate: Candidate,
        draws: Sequence[PlacementRequest],
        view: ClusterView,
        profile: Profile,
        shared: Sequence[_Step],
        rankings: _Rankings,
    ) -> float:
        name = candidate.node
        reserved = _reserved(view.nodes[name], request, candidate.gpus)
        position = 0
        for drawn, step in zip(draws, shared, strict=False):
            if step.choice is not None and step.choice[1].node.name == name:
                break
            own = view.outcome(profile, drawn, reserved)
            if isinstance(own, Candidate) and (step.choice is None or (-own.total, name) < step.choice[0]):
                break
            position += 1
        touched = {name: reserved, **shared[position].touched}
        for drawn in draws[position:]:
            choice = self._greedy(drawn, touched, view, profile, rankings)
            if choice is not None:
                move = choice[1]
                touched[move.node.name] = _reserved(move.node, drawn, move.gpus)
        return sum(self.measure(node) - self.measure(view.nodes[key]) for key, node in touched.items())

    def _greedy(
        self,
        request: PlacementRequest,
        touched: dict[str, Node],
        view: ClusterView,
        profile: Profile,
        rankings: _Rankings,
    ) -> _Ranked | None:
        """Where the profile would put `request` (its rank and move) if the touched nodes were in
        their rollout state."""
        best: _Ranked | None = None
        for name, node in touched.items():
            outcome = view.outcome(profile, request, node)
            if isinstance(outcome, Candidate):
                rank = (-outcome.total, name)
                if best is None or rank < best[0]:
                    best = (rank, _Move(node, outcome.gpus))
        for candidate in rankings.best(request, len(touched) + 1):
            if candidate.node in touched:
                continue
            rank = (-candidate.total, candidate.node)
            if best is None or rank < best[0]:
                best = (rank, _Move(view.nodes[candidate.node], candidate.gpus))
            break
        return best


class _Rankings:
    """The view's best nodes for each drawn shape, kept for one decision (the view does not change
    while a decision is weighed) and read further only when a longer prefix is needed."""

    def __init__(self, view: ClusterView, profile: Profile) -> None:
        self.view = view
        self.profile = profile
        self._best: dict[tuple[object, ...], tuple[int, list[Candidate]]] = {}

    def best(self, request: PlacementRequest, limit: int) -> list[Candidate]:
        """The `limit` best (or more), as `ClusterView.best` ranks them."""
        found = self._best.get(request.key)
        if found is None or found[0] < limit:
            found = self._best[request.key] = (limit, self.view.best(self.profile, request, limit))
        return found[1]


_Ranked = tuple[tuple[float, str], _Move]


@dataclass(frozen=True)
class _Step:
    """One draw of the shared path: the nodes touched before it and where the draw went."""

    touched: dict[str, Node]
    choice: _Ranked | None


def _reserved(node: Node, request: PlacementRequest, gpu_indices: tuple[int, ...]) -> Node:
    """`node` with `request` reserved on `gpu_indices`: `framework`'s reservation, built without
    `dataclasses.replace` (a rollout builds tens of these per decision) and keeping the node's shape."""
    gpus: list[Gpu] = list(node.gpus)
    for index in gpu_indices:
        gpu = gpus[index]
        gpus[index] = _copied(
            gpu,
            _GPU_FIELDS,
            used_tflops_milli=gpu.used_tflops_milli + request.tflops_on(gpu),
            used_vram_bytes=gpu.used_vram_bytes + request.vram_on(gpu),
            workers=gpu.workers + 1,
        )
    reserved = _copied(
        node,
        _NODE_FIELDS,
        gpus=tuple(gpus),
        used_cpu_milli=node.used_cpu_milli + request.cpu_milli,
        used_memory_bytes=node.used_memory_bytes + request.memory_bytes,
        workers=node.workers + 1,
    )
    reserved.__dict__["shape_key"] = node.shape_key
    return reserved


_GPU_FIELDS = tuple(field.name for field in fields(Gpu))
_NODE_FIELDS = tuple(field.name for field in fields(Node))


def _copied(original: _Frozen, names: tuple[str, ...], **changes: object) -> _Frozen:
    """A copy of a frozen dataclass with `changes`, its derived (cached) values left to be recomputed."""
    copy = object.__new__(type(original))
    values = original.__dict__
    copy.__dict__.update({name: values[name] for name in names})
    copy.__dict__.update(changes)
    return copy

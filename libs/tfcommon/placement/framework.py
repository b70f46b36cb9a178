"""Scheduling cycle shaped like the Kubernetes scheduling framework: filter, score, pick one node.

Plugins are small objects with one property each. Node filters run first, then GPU filters narrow
each node's candidate GPUs in order, then a node needs `gpu_count` survivors (the same-node rule);
the first filter that rules a node out is its reason. Feasible nodes are scored, highest total wins,
ties go to the node whose name sorts first (or, for a seeded profile, to a seeded uniform draw).

Results are memoized per (profile, request shape, node state) in the `ClusterView`, so only nodes
whose state changed since a request of the same shape was seen are evaluated again. Pure: no I/O,
no clock; the only randomness is a hash of the profile's seed and the request name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import ClassVar, Protocol

from tfcommon.placement.model import Gpu, Node, PlacementRequest
from tfcommon.placement.outcome import Placement, Rejection

MEMO_LIMIT = 2_000_000


class NodeFilter(Protocol):
    """Decides from the node alone whether it can host the request; `reason` says why not."""

    name: ClassVar[str]
    reason: ClassVar[str]

    def admits(self, request: PlacementRequest, node: Node) -> bool: ...


class GpuFilter(Protocol):
    """Decides whether one GPU of a node can take its per-GPU share of the request."""

    name: ClassVar[str]
    reason: ClassVar[str]

    def admits(self, request: PlacementRequest, node: Node, gpu: Gpu) -> bool: ...


@dataclass(frozen=True)
class NodeScore:
    """A plugin's score for one feasible node (higher is better) and, optionally, the GPUs it chose."""

    score: float
    gpus: tuple[int, ...] | None = None


class ScorePlugin(Protocol):
    """Ranks a feasible node. Must depend only on the request and the node's state (it is memoized).

    `normalize` asks the framework to rescale this plugin's scores to 0..100 across the feasible
    nodes of each decision (integer min-max, as kube-scheduler's NormalizeScore does).
    """

    name: ClassVar[str]
    normalize: ClassVar[bool]

    def score(self, request: PlacementRequest, node: Node, candidates: tuple[int, ...]) -> NodeScore: ...


class GpuPicker(Protocol):
    """Chooses `request.gpu_count` GPUs among a node's candidates when no scorer chose them."""

    name: ClassVar[str]

    def pick(self, request: PlacementRequest, node: Node, candidates: tuple[int, ...]) -> tuple[int, ...]: ...


@dataclass(frozen=True, eq=False)
class Profile:
    """A named set of plugins and weights: a placement policy. `seed` set means seeded tie-breaks."""

    name: str
    node_filters: tuple[NodeFilter, ...]
    gpu_filters: tuple[GpuFilter, ...]
    scorers: tuple[tuple[ScorePlugin, int], ...]
    gpu_picker: GpuPicker
    seed: int | None = None


@dataclass(frozen=True)
class _Feasible:
    scores: tuple[float, ...]
    total: float
    gpus: tuple[int, ...]


_Outcome = str | _Feasible


@dataclass
class _Group:
    """Nodes that share one state: they get identical filter and score results."""

    names: set[str] = field(default_factory=set)
    first: str | None = None

    def first_name(self) -> str:
        if self.first is None:
            self.first = min(self.names)
        return self.first


class ClusterView:
    """The scheduler's in-memory view of the nodes, indexed for incremental placement.

    Not thread-safe. `apply` and `release` return the updated node; `upsert` replaces one node
    (for example after a heartbeat changed its GPUs). Memoized results are derived data only.
    """

    def __init__(self, nodes: Iterable[Node] = ()) -> None:
        self._nodes: dict[str, Node] = {}
        self._state_ids: dict[tuple[object, ...], int] = {}
        self._next_state_id = 0
        self._state_of: dict[str, int] = {}
        self._groups: dict[int, _Group] = {}
        self._memos: dict[int, tuple[Profile, dict[tuple[object, ...], dict[int, _Outcome]]]] = {}
        for node in nodes:
            self.upsert(node)

    @property
    def nodes(self) -> Mapping[str, Node]:
        return self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    def upsert(self, node: Node) -> None:
        if node.name in self._nodes:
            self._leave_group(node.name)
        self._nodes[node.name] = node
        if len(self._state_ids) > MEMO_LIMIT:
            self._reset_memos()
        state_id = self._state_ids.get(node.state_key)
        if state_id is None:
            state_id = self._state_ids[node.state_key] = self._next_state_id
            self._next_state_id += 1
        self._state_of[node.name] = state_id
        group = self._groups.setdefault(state_id, _Group())
        group.names.add(node.name)
        if group.first is not None and node.name < group.first:
            group.first = node.name

    def remove(self, name: str) -> None:
        if name in self._nodes:
            self._leave_group(name)
            del self._nodes[name]

    def apply(self, placement: Placement) -> Node:
        """Reserve a placement on its node; the new node state replaces the old one."""
        node = self._nodes[placement.node]
        updated = _reserve(node, placement, sign=1)
        self.upsert(updated)
        return updated

    def release(self, placement: Placement) -> Node:
        """Give back exactly what `apply(placement)` reserved."""
        node = self._nodes[placement.node]
        updated = _reserve(node, placement, sign=-1)
        self.upsert(updated)
        return updated

    def _leave_group(self, name: str) -> None:
        state_id = self._state_of.pop(name)
        group = self._groups[state_id]
        group.names.discard(name)
        if not group.names:
            del self._groups[state_id]
        elif group.first == name:
            group.first = None

    def _reset_memos(self) -> None:
        self._memos.clear()
        live = {self._nodes[name].state_key: state_id for name, state_id in self._state_of.items()}
        self._state_ids = dict(live)

    def _memo_for(self, profile: Profile, request: PlacementRequest) -> dict[int, _Outcome]:
        entry = self._memos.get(id(profile))
        if entry is None or entry[0] is not profile:
            entry = (profile, {})
            self._memos[id(profile)] = entry
        return entry[1].setdefault(request.key, {})


def _reserve(node: Node, placement: Placement, *, sign: int) -> Node:
    gpus = list(node.gpus)
    for index, tflops, vram in zip(
        placement.gpu_indices, placement.tflops_milli, placement.vram_bytes, strict=True
    ):
        gpu = gpus[index]
        gpus[index] = replace(
            gpu,
            used_tflops_milli=gpu.used_tflops_milli + sign * tflops,
            used_vram_bytes=gpu.used_vram_bytes + sign * vram,
            workers=gpu.workers + sign,
        )
    classes = dict(node.workload_classes)
    classes[placement.workload_class] = classes.get(placement.workload_class, 0) + sign
    return replace(
        node,
        gpus=tuple(gpus),
        used_cpu_milli=node.used_cpu_milli + sign * placement.cpu_milli,
        used_memory_bytes=node.used_memory_bytes + sign * placement.memory_bytes,
        workers=node.workers + sign,
        workload_classes=tuple(sorted((k, v) for k, v in classes.items() if v > 0)),
    )


def evaluate(profile: Profile, request: PlacementRequest, node: Node) -> str | NodeScore:
    """Run the profile's filters and scorers on one node: the reason it is ruled out, or its score."""
    outcome = _evaluate(profile, request, node)
    if isinstance(outcome, str):
        return outcome
    return NodeScore(outcome.total, outcome.gpus)


def _evaluate(profile: Profile, request: PlacementRequest, node: Node) -> _Outcome:
    for node_filter in profile.node_filters:
        if not node_filter.admits(request, node):
            return node_filter.reason
    candidates: tuple[int, ...] = ()
    if request.gpu_count > 0:
        indices = request.gpu_indices or range(len(node.gpus))
        candidates = tuple(i for i in indices if i < len(node.gpus))
        if len(candidates) < request.gpu_count:
            return "too few GPUs"
        for gpu_filter in profile.gpu_filters:
            admits = gpu_filter.admits
            candidates = tuple([i for i in candidates if admits(request, node, node.gpus[i])])
            if len(candidates) < request.gpu_count:
                return gpu_filter.reason
    scores: list[float] = []
    chosen: tuple[int, ...] | None = None
    for scorer, _weight in profile.scorers:
        result = scorer.score(request, node, candidates)
        scores.append(result.score)
        if chosen is None and result.gpus is not None:
            chosen = result.gpus
    if chosen is None:
        chosen = profile.gpu_picker.pick(request, node, candidates) if request.gpu_count else ()
    total = sum(score * weight for score, (_scorer, weight) in zip(scores, profile.scorers, strict=True))
    return _Feasible(tuple(scores), total, chosen)


def place(
    request: PlacementRequest, cluster: ClusterView | Iterable[Node], profile: Profile
) -> Placement | Rejection:
    """Choose a node and GPUs for `request`, or explain why none fits. Does not change `cluster`
    (call `ClusterView.apply` with the result to reserve it)."""
    view = cluster if isinstance(cluster, ClusterView) else ClusterView(cluster)
    memo = view._memo_for(profile, request)
    nodes = view._nodes
    feasible: list[tuple[_Feasible, _Group]] = []
    reasons: dict[str, int] = {}
    for state_id, group in view._groups.items():
        outcome = memo.get(state_id)
        if outcome is None:
            outcome = _evaluate(profile, request, nodes[next(iter(group.names))])
            memo[state_id] = outcome
        if type(outcome) is str:
            reasons[outcome] = reasons.get(outcome, 0) + len(group.names)
        else:
            feasible.append((outcome, group))  # type: ignore[arg-type]
    if not feasible:
        ordered = tuple(sorted(reasons.items(), key=lambda item: (-item[1], item[0])))
        return Rejection(request.name, len(view), ordered, profile.name)
    totals = _totals(profile, feasible)
    best_total = max(totals)
    winners = [group for total, (_, group) in zip(totals, feasible, strict=True) if total == best_total]
    winner_index = [i for i, total in enumerate(totals) if total == best_total]
    if profile.seed is None:
        node_name = min(group.first_name() for group in winners)
    else:
        node_name = _seeded_choice(profile.seed, request.name, winners)
    outcome = next(feasible[i][0] for i in winner_index if node_name in feasible[i][1].names)
    node = view._nodes[node_name]
    return Placement(
        request_name=request.name,
        node=node_name,
        gpu_indices=outcome.gpus,
        gpu_uuids=tuple(node.gpus[i].uuid for i in outcome.gpus),
        tflops_milli=tuple(request.tflops_on(node.gpus[i]) for i in outcome.gpus),
        vram_bytes=tuple(request.vram_on(node.gpus[i]) for i in outcome.gpus),
        cpu_milli=request.cpu_milli,
        memory_bytes=request.memory_bytes,
        workload_class=request.workload_class,
        score=round(best_total),
        policy=profile.name,
    )


def _totals(profile: Profile, feasible: list[tuple[_Feasible, _Group]]) -> list[float]:
    if not any(scorer.normalize for scorer, _ in profile.scorers):
        return [outcome.total for outcome, _ in feasible]
    columns: list[list[float]] = []
    for position, (scorer, _weight) in enumerate(profile.scorers):
        raw = [outcome.scores[position] for outcome, _ in feasible]
        if scorer.normalize:
            low, high = min(raw), max(raw)
            span = high - low
            raw = [0 if span == 0 else (int(value) - int(low)) * 100 // max(int(span), 1) for value in raw]
        columns.append(raw)
    return [
        sum(columns[p][row] * weight for p, (_scorer, weight) in enumerate(profile.scorers))
        for row in range(len(feasible))
    ]


def _seeded_choice(seed: int, request_name: str, groups: list[_Group]) -> str:
    """A uniform draw among the tied nodes (in name order), from a hash of the seed and the request name."""
    names = sorted(name for group in groups for name in group.names)
    digest = hashlib.blake2b(f"{seed}/{request_name}".encode(), digest_size=8).digest()
    return names[int.from_bytes(digest, "big") % len(names)]

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
import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar, Protocol

from tfcommon.placement.model import Gpu, Node, PlacementRequest
from tfcommon.placement.outcome import Placement, Rejection

MEMO_LIMIT = 2_000_000
RANKED_KEPT = 16
CHANGE_LOG_LIMIT = 65_536


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

    def applies(self, request: PlacementRequest) -> bool:
        """False when the filter admits every GPU for `request` (it is then not asked per GPU)."""
        ...


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


@dataclass(frozen=True)
class Candidate:
    """A feasible node for a request: its total score and the GPUs the scorers chose."""

    node: str
    total: float
    gpus: tuple[int, ...]


class Chooser(Protocol):
    """Picks one of the `candidates` best placements of a request (ranked best first, at least two) by
    looking beyond the single decision; returns the index of the one to take. Must leave the view as it
    found it and be deterministic."""

    name: ClassVar[str]
    candidates: int

    def choose(
        self, request: PlacementRequest, view: ClusterView, profile: Profile, ranked: Sequence[Candidate]
    ) -> int: ...


@dataclass(frozen=True, eq=False)
class Profile:
    """A named set of plugins and weights: a placement policy. `seed` set means seeded tie-breaks;
    `chooser` set means the best few nodes are weighed by it instead of taking the top score."""

    name: str
    node_filters: tuple[NodeFilter, ...]
    gpu_filters: tuple[GpuFilter, ...]
    scorers: tuple[tuple[ScorePlugin, int], ...]
    gpu_picker: GpuPicker
    seed: int | None = None
    chooser: Chooser | None = None

    @property
    def ranks_by_total(self) -> bool:
        """Whether a node's rank depends only on its own state (no seeded draw, no normalization), so
        the view can keep each request shape's best nodes between placements."""
        return self.seed is None and not any(scorer.normalize for scorer, _ in self.scorers)


@dataclass(frozen=True)
class _Feasible:
    scores: tuple[float, ...]
    total: float
    gpus: tuple[int, ...]


_Outcome = str | _Feasible


@dataclass
class _Ranking:
    """A request shape's best feasible groups, best first, as of `version` of the view's change log.
    `boundary` is the key of the last group kept by the full scan that made it (None: it kept all
    feasible groups); every group not listed ranks below it unless one of its nodes changed since."""

    version: int
    boundary: tuple[float, str] | None
    entries: list[tuple[tuple[float, str], int]]


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
        self._rankings: dict[tuple[int, tuple[object, ...]], _Ranking] = {}
        self._changes: list[str] = []
        self._changes_base = 0
        for node in nodes:
            self.upsert(node)

    @property
    def nodes(self) -> Mapping[str, Node]:
        return self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    @property
    def version(self) -> int:
        """How many node changes (`upsert`, `remove`, `apply`, `release`) the view has had."""
        return self._changes_base + len(self._changes)

    def changed_since(self, version: int) -> set[str] | None:
        """The names of the nodes changed since the view was at `version`; None when its change log no
        longer reaches back that far (`CHANGE_LOG_LIMIT` changes)."""
        start = version - self._changes_base
        if start < 0:
            return None
        return set(self._changes[start:])

    def upsert(self, node: Node) -> None:
        if node.name in self._nodes:
            self._leave_group(node.name)
        self._nodes[node.name] = node
        self._log_change(node.name)
        if len(self._state_ids) > MEMO_LIMIT:
            self._reset_memos()
        state_id = self._state_id(node)
        self._state_of[node.name] = state_id
        group = self._groups.setdefault(state_id, _Group())
        group.names.add(node.name)
        if group.first is not None and node.name < group.first:
            group.first = node.name

    def remove(self, name: str) -> None:
        if name in self._nodes:
            self._leave_group(name)
            del self._nodes[name]
            self._log_change(name)

    def best(self, profile: Profile, request: PlacementRequest, limit: int) -> list[Candidate]:
        """The `limit` best feasible nodes for `request` (highest total first, ties by name, one per
        node state; a seeded profile's draw among equals is not applied). Kept per request shape
        between calls when the profile `ranks_by_total`, so that only nodes changed since the last
        call are evaluated; otherwise every state is ranked (normalized as `place` does)."""
        memo = self._memo_for(profile, request)
        if not profile.ranks_by_total:
            feasible = [
                (outcome, group) for _, group, outcome in self._feasible_groups(profile, request, memo)
            ]
            ranked = heapq.nsmallest(
                limit,
                zip(_totals(profile, feasible), feasible, strict=True),
                key=lambda item: (-item[0], item[1][1].first_name()),
            )
            return [Candidate(group.first_name(), total, outcome.gpus) for total, (outcome, group) in ranked]
        ranking = self._ranking(profile, request, memo, limit)
        return [self._candidate(entry, memo) for entry in ranking.entries[:limit]]

    def outcome(self, profile: Profile, request: PlacementRequest, node: Node) -> Candidate | str:
        """`request` evaluated on `node` (which need not be in the view: a state it might reach),
        memoized by the node's state: the reason it is ruled out, or its candidate."""
        memo = self._memo_for(profile, request)
        state_id = self._state_id(node)
        outcome = memo.get(state_id)
        if outcome is None:
            outcome = memo[state_id] = _evaluate(profile, request, node)
        if isinstance(outcome, str):
            return outcome
        return Candidate(node.name, outcome.total, outcome.gpus)

    def _state_id(self, node: Node) -> int:
        state_id = self._state_ids.get(node.state_key)
        if state_id is None:
            state_id = self._state_ids[node.state_key] = self._next_state_id
            self._next_state_id += 1
        return state_id

    def _log_change(self, name: str) -> None:
        if len(self._changes) >= CHANGE_LOG_LIMIT:
            self._changes_base += len(self._changes)
            self._changes = []
        self._changes.append(name)

    def _candidate(self, entry: tuple[tuple[float, str], int], memo: dict[int, _Outcome]) -> Candidate:
        (negative_total, name), state_id = entry
        outcome = memo[state_id]
        assert isinstance(outcome, _Feasible)
        return Candidate(name, -negative_total, outcome.gpus)

    def _feasible_groups(
        self, profile: Profile, request: PlacementRequest, memo: dict[int, _Outcome]
    ) -> Iterable[tuple[int, _Group, _Feasible]]:
        nodes = self._nodes
        for state_id, group in self._groups.items():
            outcome = memo.get(state_id)
            if outcome is None:
                outcome = memo[state_id] = _evaluate(profile, request, nodes[next(iter(group.names))])
            if type(outcome) is not str:
                yield state_id, group, outcome  # type: ignore[misc]

    def _ranking(
        self, profile: Profile, request: PlacementRequest, memo: dict[int, _Outcome], limit: int
    ) -> _Ranking:
        key = (id(profile), request.key)
        version = self.version
        ranking = self._rankings.get(key)
        if ranking is not None and ranking.version != version:
            ranking = self._refresh(ranking, profile, request, memo, version)
        if ranking is None or (len(ranking.entries) < limit and ranking.boundary is not None):
            keyed = [
                ((-outcome.total, group.first_name()), state_id)
                for state_id, group, outcome in self._feasible_groups(profile, request, memo)
            ]
            kept = heapq.nsmallest(max(limit, RANKED_KEPT), keyed)
            boundary = kept[-1][0] if len(kept) < len(keyed) else None
            ranking = _Ranking(version, boundary, kept)
        self._rankings[key] = ranking
        return ranking

    def _refresh(
        self,
        ranking: _Ranking,
        profile: Profile,
        request: PlacementRequest,
        memo: dict[int, _Outcome],
        version: int,
    ) -> _Ranking | None:
        """Bring a ranking up to `version`: re-read its groups, add the states of changed nodes, and
        keep what still ranks within its boundary. None when too much changed to be worth it."""
        start = ranking.version - self._changes_base
        if start < 0 or version - ranking.version > len(self._groups):
            return None
        changed = set(self._changes[start:])
        entries: dict[int, tuple[float, str]] = {}
        for (negative_total, _name), state_id in ranking.entries:
            group = self._groups.get(state_id)
            if group is not None:
                entries[state_id] = (negative_total, group.first_name())
        for name in changed:
            state_id = self._state_of.get(name)  # type: ignore[assignment]
            if state_id is None or state_id in entries:
                continue
            group = self._groups[state_id]
            outcome = memo.get(state_id)
            if outcome is None:
                outcome = memo[state_id] = _evaluate(profile, request, self._nodes[name])
            if type(outcome) is not str:
                entries[state_id] = (-outcome.total, group.first_name())  # type: ignore[union-attr]
        boundary = ranking.boundary
        kept = sorted(
            (rank, state_id) for state_id, rank in entries.items() if boundary is None or rank <= boundary
        )
        return _Ranking(version, boundary, kept)

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
        self._rankings.clear()
        live = {self._nodes[name].state_key: state_id for name, state_id in self._state_of.items()}
        self._state_ids = dict(live)

    def _memo_for(self, profile: Profile, request: PlacementRequest) -> dict[int, _Outcome]:
        entry = self._memos.get(id(profile))
        if entry is None or entry[0] is not profile:
            entry = (profile, {})
            self._memos[id(profile)] = entry
            self._rankings = {key: value for key, value in self._rankings.items() if key[0] != id(profile)}
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
    limit_tflops, limit_vram = placement.limits
    return replace(
        node,
        gpus=tuple(gpus),
        used_cpu_milli=node.used_cpu_milli + sign * placement.cpu_milli,
        used_memory_bytes=node.used_memory_bytes + sign * placement.memory_bytes,
        workers=node.workers + sign,
        workload_classes=tuple(sorted((k, v) for k, v in classes.items() if v > 0)),
        limit_tflops_milli=node.limit_tflops_milli + sign * limit_tflops,
        limit_vram_bytes=node.limit_vram_bytes + sign * limit_vram,
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
            if not gpu_filter.applies(request):
                continue
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
    if profile.ranks_by_total:
        chooser = profile.chooser
        ranked = view.best(profile, request, chooser.candidates if chooser is not None else 1)
        if ranked:
            chosen = ranked[0]
            if chooser is not None and len(ranked) > 1:
                chosen = ranked[chooser.choose(request, view, profile, ranked)]
            return _placement(request, view, profile, chosen)
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
    return _placement(request, view, profile, Candidate(node_name, best_total, outcome.gpus))


def _placement(
    request: PlacementRequest, view: ClusterView, profile: Profile, chosen: Candidate
) -> Placement:
    node = view._nodes[chosen.node]
    return Placement(
        request_name=request.name,
        node=chosen.node,
        gpu_indices=chosen.gpus,
        gpu_uuids=tuple(node.gpus[i].uuid for i in chosen.gpus),
        tflops_milli=tuple(request.tflops_on(node.gpus[i]) for i in chosen.gpus),
        vram_bytes=tuple(request.vram_on(node.gpus[i]) for i in chosen.gpus),
        cpu_milli=request.cpu_milli,
        memory_bytes=request.memory_bytes,
        workload_class=request.workload_class,
        score=round(chosen.total),
        policy=profile.name,
        limit_tflops_milli=tuple(request.limit_tflops_on(node.gpus[i]) for i in chosen.gpus),
        limit_vram_bytes=tuple(request.limit_vram_on(node.gpus[i]) for i in chosen.gpus),
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

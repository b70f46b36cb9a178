"""Card values: how much of a GPU a card with a given free share is expected to leave idle for good.

FGD's fragment measure scores a card by the share of the next task it could not take, so it calls a
350-thousandths hole several times worse than a 120 one. What decides the allocation at the end is
different: the share each card still has free when the cluster saturates. A 350 hole is usually
closed later by a common 320 pod (30 left idle); a 120 hole waits for the rare pods of 120 or less
and mostly stays idle; a free card ends with a whole-GPU pod, or with an 810 pod and its 190 hole.

`calibrate_card_values` estimates that final idle share for every free share (0-1000 thousandths)
from the target workload, by a seeded simulation of single-GPU cards: pods are drawn from the
workload's GPU classes until requests reach `inflate` x capacity, as in the trace protocol, and each
is put in the smallest hole that fits it (a whole-GPU pod takes free cards); each card's final free
share is credited to every free share it held while the cluster was between `WINDOW` full. Free
shares below the smallest pod stay idle; others no card held often enough are interpolated between
their neighbours. (Placing by the values themselves instead of best fit, round after round, does
not settle: the values swing between rounds.) Pure and deterministic: the same workload gives the
same values. `CardValueMeasure` turns them into a node measure: the default
policy's rollout (rollout.py) keeps the candidate whose rollout grows it least.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass
from functools import lru_cache

from tfcommon.placement.fragmentation import TargetWorkload, node_fragment, node_gpu_states
from tfcommon.placement.gradient import FRAGMENT_MEMO_LIMIT
from tfcommon.placement.model import WHOLE_GPU_SHARE, Node

DEFAULT_CARDS = 16384
DEFAULT_INFLATE = 1.3
WINDOW = (0.25, 0.95)
"""The cluster's allocation (share of capacity) between which visited free shares are credited."""
_BEFORE, _DURING, _AFTER = -1, 0, 1
MIN_VISITS = 20
"""A free share visited fewer times than this is interpolated instead of read from its visits."""


@dataclass(frozen=True)
class CardValues:
    """The expected idle share left on a card for each free share, `idle[free]` for free in 0..1000."""

    idle: tuple[float, ...]

    def __call__(self, free_share: int) -> float:
        return self.idle[free_share]

    @classmethod
    def best_fit(cls) -> CardValues:
        """Every partial hole stays idle and a free card is filled: what best fit assumes."""
        return cls((*(float(free) for free in range(WHOLE_GPU_SHARE)), 0.0))


@dataclass(frozen=True)
class _PodShape:
    share: int
    gpu_count: int


def gpu_shapes(target: TargetWorkload) -> tuple[tuple[_PodShape, ...], tuple[float, ...]]:
    """The target's GPU classes as (per-GPU share, GPU count) with their popularity (CPU-only classes
    and models dropped: the simulation sees only shares)."""
    weights: dict[_PodShape, float] = {}
    for workload_class, popularity in target.classes:
        if workload_class.gpu_count == 0 or workload_class.gpu_share <= 0:
            continue
        shape = _PodShape(min(workload_class.gpu_share, WHOLE_GPU_SHARE), workload_class.gpu_count)
        weights[shape] = weights.get(shape, 0.0) + popularity
    ordered = sorted(weights, key=lambda shape: (shape.share, shape.gpu_count))
    return tuple(ordered), tuple(weights[shape] for shape in ordered)


def calibrate_card_values(
    target: TargetWorkload,
    *,
    seed: int = 0,
    cards: int = DEFAULT_CARDS,
    inflate: float = DEFAULT_INFLATE,
) -> CardValues:
    """Card values for `target` (see the module docstring); best fit's when it has no GPU classes."""
    shapes, weights = gpu_shapes(target)
    if not shapes:
        return CardValues.best_fit()
    return _simulate(shapes, weights, random.Random(f"card-values/{seed}/0"), cards, inflate)


@lru_cache(maxsize=8)
def card_values_for(target: TargetWorkload) -> CardValues:
    """`calibrate_card_values` with the defaults, kept for the last few target workloads (a scheduler
    builds a policy per pool from the same target)."""
    return calibrate_card_values(target)


def _simulate(
    shapes: tuple[_PodShape, ...],
    weights: tuple[float, ...],
    rng: random.Random,
    cards: int,
    inflate: float,
) -> CardValues:
    capacity = cards * WHOLE_GPU_SHARE
    free = [WHOLE_GPU_SHARE] * cards
    by_free: dict[int, list[int]] = {WHOLE_GPU_SHARE: list(range(cards))}
    present: list[int] = [WHOLE_GPU_SHARE]
    visits: list[list[tuple[int, int]]] = [[(WHOLE_GPU_SHARE, _BEFORE)] for _ in range(cards)]
    low, high = WINDOW[0] * capacity, WINDOW[1] * capacity
    requested = allocated = 0

    def take(free_share: int) -> int:
        bucket = by_free[free_share]
        card = bucket.pop()
        if not bucket:
            del by_free[free_share]
            present.pop(bisect.bisect_left(present, free_share))
        return card

    def put(card: int, free_share: int, phase: int) -> None:
        free[card] = free_share
        bucket = by_free.get(free_share)
        if bucket is None:
            by_free[free_share] = [card]
            bisect.insort(present, free_share)
        else:
            bucket.append(card)
        visits[card].append((free_share, phase))

    while True:
        shape = rng.choices(shapes, weights)[0]
        demand = shape.share * shape.gpu_count
        if requested + demand > inflate * capacity:
            break
        requested += demand
        phase = _BEFORE if allocated < low else _DURING if allocated <= high else _AFTER
        chosen: list[int] = []
        for _ in range(shape.gpu_count):
            smallest_fit = bisect.bisect_left(present, shape.share)
            if smallest_fit == len(present):
                break
            chosen.append(take(present[smallest_fit]))
        if len(chosen) < shape.gpu_count:
            for card in chosen:
                put(card, free[card], phase)
                visits[card].pop()
            continue
        for card in chosen:
            put(card, free[card] - shape.share, phase)
        allocated += demand
    return _estimate(visits, free, smallest_share=shapes[0].share)


def _estimate(visits: list[list[tuple[int, int]]], final: list[int], smallest_share: int) -> CardValues:
    """Each card's final free share, credited to each free share it held while the cluster was in the
    window (entered there, or entered before and left during or after it)."""
    totals = [0.0] * (WHOLE_GPU_SHARE + 1)
    counts = [0] * (WHOLE_GPU_SHARE + 1)
    for card, path in enumerate(visits):
        credited: set[int] = set()
        for position, (free_share, phase) in enumerate(path):
            left_at = path[position + 1][1] if position + 1 < len(path) else _AFTER
            held_in_window = phase == _DURING or (phase == _BEFORE and left_at != _BEFORE)
            if held_in_window and free_share not in credited:
                credited.add(free_share)
                totals[free_share] += final[card]
                counts[free_share] += 1
    known = {
        free_share: totals[free_share] / counts[free_share]
        for free_share in range(WHOLE_GPU_SHARE + 1)
        if counts[free_share] >= MIN_VISITS
    }
    known.update({free_share: float(free_share) for free_share in range(smallest_share)})
    return CardValues(_interpolated(known))


def _interpolated(known: dict[int, float]) -> tuple[float, ...]:
    """Every free share's value: read where known (a share below the smallest pod's stays idle), straight
    lines between known neighbours, and the share itself above the highest known one."""
    points = sorted(known)
    idle: list[float] = []
    for free_share in range(WHOLE_GPU_SHARE + 1):
        value = known.get(free_share)
        if value is None:
            right = bisect.bisect_left(points, free_share)
            if right == len(points):
                value = float(free_share)
            else:
                lower, upper = points[right - 1], points[right]
                fraction = (free_share - lower) / (upper - lower)
                value = known[lower] * (1 - fraction) + known[upper] * fraction
        idle.append(value)
    return tuple(idle)


class CardValueMeasure:
    """A node's expected idle share for good (the rollout's measure): the card value of each GPU's
    free share, or the whole free share when the node lacks the CPU or memory for every GPU class of
    the target (nothing will close its holes); plus FGD's fragment F_n(M) over the classes card values
    cannot see, multi-GPU ones (they need several free cards on one node) and those limited to some GPU
    models, with their popularity in the target (none in a target of single-GPU, any-model classes)."""

    def __init__(self, values: CardValues, target: TargetWorkload) -> None:
        self.values = values.idle
        self.smallest_needs = _smallest_needs(target)
        self.unseen = TargetWorkload(
            tuple(
                (workload_class, popularity)
                for workload_class, popularity in target.classes
                if workload_class.gpu_count > 1 or workload_class.gpu_models
            )
        )
        self._models_matter = any(workload_class.gpu_models for workload_class, _ in self.unseen.classes)
        self._measures: dict[tuple[object, ...], float] = {}

    def __call__(self, node: Node) -> float:
        free_cpu = node.free_cpu_milli
        free_memory = node.free_memory_bytes
        key: tuple[object, ...] = (
            (free_cpu, free_memory, node_gpu_states(node))
            if self._models_matter
            else (free_cpu, free_memory, node.free_shares)
        )
        measure = self._measures.get(key)
        if measure is None:
            if len(self._measures) > FRAGMENT_MEMO_LIMIT:
                self._measures.clear()
            measure = self._measures[key] = self._measure(node, free_cpu, free_memory)
        return measure

    def _measure(self, node: Node, free_cpu: int, free_memory: int) -> float:
        shares = node.free_shares
        if any(free_cpu >= cpu and free_memory >= memory for cpu, memory in self.smallest_needs):
            values = self.values
            measure = sum(values[max(share, 0)] for share in shares)
        else:
            measure = float(sum(shares))
        if self.unseen.classes:
            measure += node_fragment(free_cpu, node_gpu_states(node), self.unseen, free_memory)
        return measure


def _smallest_needs(target: TargetWorkload) -> tuple[tuple[int, int], ...]:
    """The (CPU, memory) needs of the target's GPU classes that no other class's needs undercut."""
    needs = {
        (workload_class.cpu_milli, workload_class.memory_bytes)
        for workload_class, _ in target.classes
        if workload_class.gpu_count > 0
    }
    return tuple(
        sorted(
            need
            for need in needs
            if not any(other != need and other[0] <= need[0] and other[1] <= need[1] for other in needs)
        )
    )

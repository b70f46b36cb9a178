"""The workload mix the scheduler's fragmentation-aware policies aim at, learned from recent submissions.

`RecentWorkload` keeps a sliding window of the latest requests, already sorted into task classes, so
that relearning costs a pass over the classes, not over the window. It says when to relearn (at 1, 2,
4, ... submissions, then every `relearn_every`) and whether a new target differs enough from the one
in use to be worth a new policy: a new policy starts with no memoized node scores, so every node is
scored again on its next placement. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import deque

from tfcommon.placement import PlacementRequest, PluginArgs, TargetWorkload, WorkloadClass

POPULARITY_TOLERANCE = 0.01
"""Largest change in a class's popularity that keeps the target in use (same classes otherwise)."""


class RecentWorkload:
    """The last `window` requests by class, with the memory each asked for, in arrival order."""

    def __init__(self, window: int, relearn_every: int) -> None:
        self.window = window
        self.relearn_every = relearn_every
        self._arrivals: deque[WorkloadClass] = deque()
        self._memories: dict[WorkloadClass, deque[int]] = {}
        self._seen = 0
        self._learned_at = 0

    def add(self, request: PlacementRequest) -> None:
        """Count one submitted request; the oldest one leaves the window when it is full."""
        workload_class = WorkloadClass.of(request)
        self._arrivals.append(workload_class)
        self._memories.setdefault(workload_class, deque()).append(request.memory_bytes)
        if len(self._arrivals) > self.window:
            oldest = self._arrivals.popleft()
            memories = self._memories[oldest]
            memories.popleft()
            if not memories:
                del self._memories[oldest]
        self._seen += 1

    @property
    def seen(self) -> int:
        """How many requests were counted since the start."""
        return self._seen

    def due(self) -> bool:
        """Whether enough new requests arrived since the last `learn()`: doubling, then every
        `relearn_every`."""
        new = self._seen - self._learned_at
        return new > 0 and (new >= self._learned_at or new >= self.relearn_every)

    def learn(self) -> PluginArgs:
        """The plugin arguments with the target workloads of the requests in the window now."""
        self._learned_at = self._seen
        return PluginArgs.learned_from_classes(self._memories)


def same_target(current: PluginArgs, learned: PluginArgs, tolerance: float = POPULARITY_TOLERANCE) -> bool:
    """Whether `learned` would place like `current`: the same classes (memory included) in both
    targets, each popularity within `tolerance`."""
    pairs = [(current.target, learned.target), (current.memory_target, learned.memory_target)]
    return all(_close(old, new, tolerance) for old, new in pairs)


def _close(old: TargetWorkload | None, new: TargetWorkload | None, tolerance: float) -> bool:
    if old is None or new is None:
        return old is new
    if [workload_class for workload_class, _ in old.classes] != [
        workload_class for workload_class, _ in new.classes
    ]:
        return False
    return all(
        abs(old_share - new_share) <= tolerance
        for (_, old_share), (_, new_share) in zip(old.classes, new.classes, strict=True)
    )

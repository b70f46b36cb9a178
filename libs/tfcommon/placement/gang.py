"""Gang placement, pure: place the members of a gang together, or none of them.

`place_gang(members, view, profile, needed=...)` places each member in order, each one seeing the
capacity the earlier members took, and returns every placement when at least `needed` members fit,
or no placement at all (with how many fit, for the report) when fewer do. The view is left as it was:
the caller applies the placements it reserves. No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from tfcommon.placement.framework import ClusterView, Profile, place
from tfcommon.placement.model import PlacementRequest
from tfcommon.placement.outcome import Placement, Rejection

K = TypeVar("K", bound=Hashable)

__all__ = ["GangPlacement", "place_gang"]


@dataclass(frozen=True)
class GangPlacement(Generic[K]):
    """The outcome for one gang. `placements` holds every member placed (in member order) when
    `enough`, and is empty otherwise; `fitted` counts the members that fit either way; `rejections`
    are the members that did not fit, with why."""

    placements: tuple[tuple[K, Placement], ...]
    rejections: tuple[tuple[K, Rejection], ...]
    fitted: int
    needed: int

    @property
    def enough(self) -> bool:
        """At least `needed` members fit (so `placements` holds them all)."""
        return self.fitted >= self.needed


def place_gang(
    members: Sequence[tuple[K, PlacementRequest]], view: ClusterView, profile: Profile, *, needed: int
) -> GangPlacement[K]:
    """Place `members` one after another against `view` (each sees the earlier ones' capacity taken);
    all the placements when at least `needed` fit, none otherwise. `view` is unchanged on return."""
    placed: list[tuple[K, Placement]] = []
    rejected: list[tuple[K, Rejection]] = []
    try:
        for key, request in members:
            outcome = place(request, view, profile)
            if isinstance(outcome, Rejection):
                rejected.append((key, outcome))
                continue
            view.apply(outcome)
            placed.append((key, outcome))
    finally:
        for _key, placement in reversed(placed):
            view.release(placement)
    fitted = len(placed)
    return GangPlacement(
        placements=tuple(placed) if fitted >= needed else (),
        rejections=tuple(rejected),
        fitted=fitted,
        needed=needed,
    )

"""A submitted workload's life as one transition table: every state change the scheduler makes goes
through it. Pure.

A workload starts `pending`. `place` moves it to `placed` (its allocation is written), `wait` keeps it
`pending` with a new reason, `refuse` ends it `refused` (it can never fit), `end` closes it `ended`
(released, completed or deleted) and `evict` closes it `evicted` (preempted or drained; a replacement is
a new workload). `refused`, `ended` and `evicted` are final: nothing moves a workload out of them, so a
late placement or release cannot bring a closed workload back. The workload store applies a transition
only from the states this table allows (`sources`), in SQL, so two schedulers racing on one workload
agree with it too.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from tfscheduler.submission import WorkloadState

__all__ = [
    "FINAL_STATES",
    "INITIAL_STATE",
    "IllegalTransitionError",
    "Transition",
    "next_state",
    "sources",
    "target",
]


class Transition(StrEnum):
    """What happened to a workload."""

    PLACE = "place"
    WAIT = "wait"
    REFUSE = "refuse"
    END = "end"
    EVICT = "evict"


INITIAL_STATE: Final[WorkloadState] = "pending"
FINAL_STATES: Final[frozenset[WorkloadState]] = frozenset({"refused", "ended", "evicted"})

_TABLE: Final[dict[tuple[WorkloadState, Transition], WorkloadState]] = {
    ("pending", Transition.PLACE): "placed",
    ("placed", Transition.PLACE): "placed",
    ("pending", Transition.WAIT): "pending",
    ("pending", Transition.REFUSE): "refused",
    ("pending", Transition.END): "ended",
    ("placed", Transition.END): "ended",
    ("pending", Transition.EVICT): "evicted",
    ("placed", Transition.EVICT): "evicted",
}


class IllegalTransitionError(ValueError):
    """A transition the table does not allow from the workload's state."""


def next_state(state: WorkloadState, transition: Transition) -> WorkloadState:
    """The state `transition` leads to from `state`; raises `IllegalTransitionError` when none."""
    found = _TABLE.get((state, transition))
    if found is None:
        raise IllegalTransitionError(f"a {state} workload cannot {transition.value}")
    return found


def sources(transition: Transition) -> tuple[WorkloadState, ...]:
    """The states `transition` may start from (what the store's update requires), in a fixed order."""
    return tuple(sorted({state for state, step in _TABLE if step is transition}))


def target(transition: Transition) -> WorkloadState:
    """The one state `transition` leads to (every transition of the table has one)."""
    (found,) = {to for (_state, step), to in _TABLE.items() if step is transition}
    return found

"""The workload lifecycle table (`tfscheduler.core.lifecycle`): what each transition leads to, from
which states, and that a closed workload never moves again."""

from __future__ import annotations

from typing import get_args

import pytest
from tfscheduler.core.lifecycle import (
    FINAL_STATES,
    INITIAL_STATE,
    IllegalTransitionError,
    Transition,
    next_state,
    sources,
    target,
)
from tfscheduler.submission import WorkloadState

STATES: tuple[WorkloadState, ...] = get_args(WorkloadState)


@pytest.mark.parametrize(
    ("state", "transition", "expected"),
    [
        ("pending", Transition.PLACE, "placed"),
        ("placed", Transition.PLACE, "placed"),
        ("pending", Transition.WAIT, "pending"),
        ("pending", Transition.REFUSE, "refused"),
        ("pending", Transition.END, "ended"),
        ("placed", Transition.END, "ended"),
        ("pending", Transition.EVICT, "evicted"),
        ("placed", Transition.EVICT, "evicted"),
    ],
)
def test_each_allowed_transition_leads_to_its_state(
    state: WorkloadState, transition: Transition, expected: WorkloadState
) -> None:
    assert next_state(state, transition) == expected
    assert target(transition) == expected
    assert state in sources(transition)


@pytest.mark.parametrize("state", sorted(FINAL_STATES))
@pytest.mark.parametrize("transition", list(Transition))
def test_a_closed_workload_never_moves_again(state: WorkloadState, transition: Transition) -> None:
    with pytest.raises(IllegalTransitionError, match=f"a {state} workload cannot {transition.value}"):
        next_state(state, transition)
    assert state not in sources(transition)


@pytest.mark.parametrize(
    ("state", "transition"),
    [("placed", Transition.WAIT), ("placed", Transition.REFUSE)],
)
def test_a_placed_workload_is_neither_sent_back_to_wait_nor_refused(
    state: WorkloadState, transition: Transition
) -> None:
    with pytest.raises(IllegalTransitionError):
        next_state(state, transition)


def test_every_state_is_reachable_from_the_initial_one() -> None:
    reached = {INITIAL_STATE}
    frontier = [INITIAL_STATE]
    while frontier:
        state = frontier.pop()
        for transition in Transition:
            try:
                following = next_state(state, transition)
            except IllegalTransitionError:
                continue
            if following not in reached:
                reached.add(following)
                frontier.append(following)
    assert reached == set(STATES)

"""The scheduler's learned workload mix: a sliding window of recent requests, relearned cheaply.

What a user relies on: the target the policies aim at is exactly what learning from the window's
requests from scratch gives, old requests leave it, relearning follows the doubling-then-periodic
schedule, and an unchanged mix keeps the policies in use (their memoized node scores with them).
"""

from __future__ import annotations

from tfcommon.gpu_models import GIB
from tfcommon.placement import PlacementRequest, PluginArgs
from tfscheduler.core.learning import RecentWorkload, same_target


def request(share: int, *, memory_gib: int = 1, cpu_milli: int = 1000) -> PlacementRequest:
    return PlacementRequest(name="r", gpu_share=share, memory_bytes=memory_gib * GIB, cpu_milli=cpu_milli)


MIX = [
    request(500, memory_gib=4),
    request(250),
    request(1000, memory_gib=8),
    request(500, memory_gib=2),
] * 7 + [request(125, cpu_milli=4000)]


def test_the_learned_target_is_what_the_window_of_requests_gives_from_scratch() -> None:
    recent = RecentWorkload(window=20, relearn_every=8)
    for each in MIX:
        recent.add(each)

    learned = recent.learn()

    expected = PluginArgs.learned_from(MIX[-20:])
    assert learned.target == expected.target
    assert learned.memory_target == expected.memory_target
    assert learned.target.classes, "a non-empty mix has a target"


def test_requests_older_than_the_window_leave_the_target() -> None:
    recent = RecentWorkload(window=4, relearn_every=8)
    for _ in range(4):
        recent.add(request(250))
    for _ in range(4):
        recent.add(request(750, memory_gib=3))

    target = recent.learn().target

    assert [(workload_class.gpu_share, share) for workload_class, share in target.classes] == [(750, 1.0)]


def test_relearning_doubles_then_follows_the_period() -> None:
    recent = RecentWorkload(window=100, relearn_every=4)
    due_at = []
    for number in range(1, 21):
        recent.add(request(500))
        if recent.due():
            recent.learn()
            due_at.append(number)

    assert due_at == [1, 2, 4, 8, 12, 16, 20]


def test_an_unchanged_mix_keeps_the_target_and_a_shifted_one_replaces_it() -> None:
    recent = RecentWorkload(window=200, relearn_every=10)
    for _ in range(100):
        recent.add(request(500))
        recent.add(request(250))
    first = recent.learn()
    recent.add(request(500))
    slightly_more = recent.learn()
    for _ in range(60):
        recent.add(request(500))
    shifted = recent.learn()
    recent.add(request(1000, memory_gib=40))
    for _ in range(40):
        recent.add(request(1000, memory_gib=40))
    new_class = recent.learn()

    assert same_target(first, slightly_more), "one more request moves a popularity by well under 1%"
    assert not same_target(first, shifted), "the 500 class went from half to about two thirds"
    assert not same_target(shifted, new_class), "a class that was not there before"

"""The view keeps each request shape's best nodes between placements: the ranking a fresh view makes."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tfcommon.placement import ClusterView, Placement, PlacementRequest, PluginArgs, place, policy
from tfcommon.placement.testing import a_node

SHARES = (0, 230, 470, 500, 810, 1000)


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[PlacementRequest], list[tuple[str, int]], str]:
    shapes = [
        PlacementRequest(name=f"shape-{i}", cpu_milli=draw(st.integers(0, 4)) * 1000, gpu_share=share)
        for i, share in enumerate(draw(st.lists(st.sampled_from(SHARES[1:]), min_size=1, max_size=3)))
    ]
    steps = draw(
        st.lists(st.tuples(st.sampled_from(["place", "release", "rank"]), st.integers(0, 99)), max_size=40)
    )
    return shapes, steps, draw(st.sampled_from(["tfpool", "fgd", "CompactFirst", "tfpool-rollout"]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), st.integers(1, 40))
def test_the_kept_ranking_is_the_fresh_ranking(
    history: tuple[list[PlacementRequest], list[tuple[str, int]], str], nodes_count: int
) -> None:
    shapes, steps, name = history
    nodes = [
        a_node(f"node-{i:02d}", gpus=1 + i % 3, used_shares=(SHARES[i % len(SHARES)],), cpu_milli=8000)
        for i in range(nodes_count)
    ]
    profile = policy(name, PluginArgs.learned_from(shapes, seed=1))
    view = ClusterView(nodes)
    placed: list[Placement] = []
    for action, pick in steps:
        request = shapes[pick % len(shapes)]
        if action == "place":
            outcome = place(request, view, profile)
            if isinstance(outcome, Placement):
                view.apply(outcome)
                placed.append(outcome)
        elif action == "release" and placed:
            view.release(placed.pop(pick % len(placed)))
        limit = 1 + pick % 5
        fresh = ClusterView(view.nodes.values())
        assert view.best(profile, request, limit) == fresh.best(profile, request, limit)

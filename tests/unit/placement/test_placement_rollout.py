"""The rollout chooser: the best few nodes weighed by playing drawn pods forward, deterministically."""

from __future__ import annotations

import pytest
from tfcommon.placement import (
    ClusterView,
    Node,
    Placement,
    PlacementRequest,
    PluginArgs,
    ProfileConfig,
    TargetWorkload,
    WorkloadClass,
    build_profile,
    place,
    policy,
)
from tfcommon.placement.framework import Profile
from tfcommon.placement.rollout import Rollout, sample_request
from tfcommon.placement.testing import a_node

WHOLE = WorkloadClass(cpu_milli=1000, gpu_count=1, gpu_share=1000)
HALF = WorkloadClass(cpu_milli=1000, gpu_count=1, gpu_share=500)


def crumbs(node: Node) -> float:
    """Free share stranded on partly used cards: what the table's rollouts try to keep low."""
    return float(sum(free for free in node.free_shares if 0 < free < 1000))


def by_name(rollout: Rollout | None) -> Profile:
    """Every node scores alike, so the profile's own order is by name; `rollout` weighs the first few."""
    plain = build_profile(ProfileConfig("by-name", (("Indifferent", 1),)), PluginArgs())
    return Profile(
        plain.name, plain.node_filters, plain.gpu_filters, plain.scorers, plain.gpu_picker, chooser=rollout
    )


def half_card(name: str = "job") -> PlacementRequest:
    return PlacementRequest(name=name, cpu_milli=1000, gpu_share=500)


@pytest.mark.parametrize(
    ("case", "nodes", "target", "candidates", "depth", "expected"),
    [
        (
            "a whole-GPU pod is coming: fill the half-used card, keep the idle one whole",
            [a_node("a"), a_node("b", used_shares=(500,))],
            TargetWorkload(((WHOLE, 1.0),)),
            3,
            1,
            "b",
        ),
        (
            "only half-GPU pods are coming: either card ends full, the profile's order stands",
            [a_node("a"), a_node("b", used_shares=(500,))],
            TargetWorkload(((HALF, 1.0),)),
            3,
            1,
            "a",
        ),
        (
            "nothing to draw from: the profile's order stands",
            [a_node("a"), a_node("b", used_shares=(500,))],
            TargetWorkload(()),
            3,
            4,
            "a",
        ),
        (
            "the better node is beyond the candidates weighed (one per node state): the order stands",
            [a_node("a"), a_node("b", gpus=2), a_node("c", used_shares=(500,))],
            TargetWorkload(((WHOLE, 1.0),)),
            2,
            2,
            "a",
        ),
        (
            "weighing three finds it",
            [a_node("a"), a_node("b", gpus=2), a_node("c", used_shares=(500,))],
            TargetWorkload(((WHOLE, 1.0),)),
            3,
            2,
            "c",
        ),
    ],
)
def test_the_rollout_takes_the_candidate_whose_future_strands_least(
    case: str,
    nodes: list[Node],
    target: TargetWorkload,
    candidates: int,
    depth: int,
    expected: str,
) -> None:
    rollout = Rollout(crumbs, target, candidates=candidates, depth=depth)
    outcome = place(half_card(), nodes, by_name(rollout))
    assert isinstance(outcome, Placement), case
    assert outcome.node == expected, case


def test_without_a_rollout_the_profile_takes_its_first_node() -> None:
    outcome = place(half_card(), [a_node("a"), a_node("b", used_shares=(500,))], by_name(None))
    assert isinstance(outcome, Placement)
    assert outcome.node == "a"


def test_the_rollout_reserves_nothing_in_the_view() -> None:
    nodes = [a_node("a"), a_node("b", used_shares=(500,)), a_node("c", gpus=2)]
    view = ClusterView(nodes)
    before = dict(view.nodes)
    place(half_card(), view, by_name(Rollout(crumbs, TargetWorkload(((WHOLE, 1.0),)), depth=6)))
    assert dict(view.nodes) == before


def test_draws_follow_the_seed_and_the_request_name() -> None:
    target = TargetWorkload(((WHOLE, 0.5), (HALF, 0.5)))
    draws = Rollout(crumbs, target, seed=3, depth=16).draws(half_card("job-1"))
    assert draws == Rollout(crumbs, target, seed=3, depth=16).draws(half_card("job-1"))
    assert {request.gpu_share for request in draws} == {500, 1000}
    assert draws != Rollout(crumbs, target, seed=4, depth=16).draws(half_card("job-1"))
    assert draws != Rollout(crumbs, target, seed=3, depth=16).draws(half_card("job-2"))


def test_a_drawn_pod_asks_for_what_its_class_holds() -> None:
    workload_class = WorkloadClass(
        cpu_milli=4000, gpu_count=2, gpu_share=810, gpu_models=frozenset({"T4"}), memory_bytes=1 << 30
    )
    request = sample_request(workload_class, "draw")
    assert (request.cpu_milli, request.gpu_count, request.gpu_share) == (4000, 2, 810)
    assert (request.gpu_models, request.memory_bytes) == (frozenset({"T4"}), 1 << 30)
    cpu_only = sample_request(WorkloadClass(cpu_milli=2000, gpu_count=0, gpu_share=0), "cpu")
    assert (cpu_only.gpu_count, cpu_only.gpu_share) == (0, None)


def test_the_rollout_policy_weighs_four_nodes_eight_pods_deep() -> None:
    profile = policy("tfpool-rollout", PluginArgs.learned_from([half_card()]))
    assert isinstance(profile.chooser, Rollout)
    assert (profile.chooser.candidates, profile.chooser.depth) == (4, 8)
    assert policy("tfpool").chooser is None


def test_a_rollout_without_a_fragmentation_gradient_is_refused() -> None:
    config = ProfileConfig("odd", (("BestFit", 1),), rollout_candidates=3, rollout_depth=8)
    with pytest.raises(ValueError, match="fragmentation-gradient scorer"):
        build_profile(config, PluginArgs())

"""The rollout chooser: the best few nodes weighed by playing drawn pods forward, deterministically."""

from __future__ import annotations

import random
from dataclasses import replace

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
from tfcommon.placement.framework import Candidate, Profile
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


def test_the_rollout_policy_weighs_four_nodes_six_pods_deep() -> None:
    profile = policy("tfpool-rollout", PluginArgs.learned_from([half_card()]))
    assert isinstance(profile.chooser, Rollout)
    assert (profile.chooser.candidates, profile.chooser.depth) == (4, 6)
    assert policy("tfpool").chooser is None


def test_a_rollout_without_a_fragmentation_gradient_is_refused() -> None:
    config = ProfileConfig("odd", (("BestFit", 1),), rollout_candidates=3, rollout_depth=8)
    with pytest.raises(ValueError, match="fragmentation-gradient scorer"):
        build_profile(config, PluginArgs())


def test_a_cpu_only_pod_takes_the_profiles_first_node_without_weighing() -> None:
    def stranded_by_cpu(node: Node) -> float:
        return float(sum(node.free_shares)) if node.free_cpu_milli < 1000 else 0.0

    nodes = [a_node("a", cpu_milli=2000), a_node("b", cpu_milli=2000, used_shares=(500,))]
    gpu_pod = PlacementRequest(name="gpu-job", cpu_milli=1500, gpu_share=500)
    weighed = place(gpu_pod, nodes, by_name(Rollout(stranded_by_cpu, TargetWorkload(((WHOLE, 1.0),)))))
    assert isinstance(weighed, Placement)
    assert weighed.node == "b"
    cpu_pod = PlacementRequest(name="cpu-job", cpu_milli=1500, gpu_count=0)
    outcome = place(cpu_pod, nodes, by_name(Rollout(stranded_by_cpu, TargetWorkload(((WHOLE, 1.0),)))))
    assert isinstance(outcome, Placement)
    assert outcome.node == "a"


def played_forward(
    rollout: Rollout, request: PlacementRequest, view: ClusterView, profile: Profile, candidate: Candidate
) -> float:
    """The module docstring's rollout for one candidate, played on its own (the reference)."""

    def reserved(node: Node, drawn: PlacementRequest, gpus: tuple[int, ...]) -> Node:
        cards = list(node.gpus)
        for i in gpus:
            card = cards[i]
            cards[i] = replace(
                card,
                used_tflops_milli=card.used_tflops_milli + drawn.tflops_on(card),
                used_vram_bytes=card.used_vram_bytes + drawn.vram_on(card),
                workers=card.workers + 1,
            )
        return replace(
            node,
            gpus=tuple(cards),
            used_cpu_milli=node.used_cpu_milli + drawn.cpu_milli,
            used_memory_bytes=node.used_memory_bytes + drawn.memory_bytes,
            workers=node.workers + 1,
        )

    touched = {candidate.node: reserved(view.nodes[candidate.node], request, candidate.gpus)}
    for drawn in rollout.draws(request):
        options = [
            ((-outcome.total, name), outcome.gpus)
            for name, node in touched.items()
            if isinstance(outcome := view.outcome(profile, drawn, node), Candidate)
        ]
        untouched = [c for c in view.best(profile, drawn, len(touched) + 1) if c.node not in touched]
        options += [((-c.total, c.node), c.gpus) for c in untouched[:1]]
        if options:
            (_total, name), gpus = min(options)
            touched[name] = reserved(touched.get(name, view.nodes[name]), drawn, gpus)
    return sum(rollout.measure(node) - rollout.measure(view.nodes[name]) for name, node in touched.items())


@pytest.mark.parametrize("seed", range(6))
def test_the_shared_rollout_chooses_as_rollouts_played_one_candidate_at_a_time(seed: int) -> None:
    rng = random.Random(seed)
    shares = (0, 0, 230, 470, 500, 810, 1000)
    nodes = [
        a_node(f"n{i:02d}", gpus=4, used_shares=tuple(rng.choice(shares) for _ in range(4)))
        for i in range(24)
    ]
    requests = [
        PlacementRequest(name=f"job-{i}", cpu_milli=1000, gpu_count=count, gpu_share=share)
        for i, (count, share) in enumerate(
            rng.choices([(1, 230), (1, 500), (1, 810), (1, 1000), (2, 1000)], k=30)
        )
    ]
    profile = policy("tfpool-rollout", PluginArgs.learned_from(requests, seed=seed))
    rollout = profile.chooser
    assert isinstance(rollout, Rollout)
    view = ClusterView(nodes)
    weighed = 0
    for request in requests:
        ranked = view.best(profile, request, rollout.candidates)
        if len(ranked) > 1:
            growths = [played_forward(rollout, request, view, profile, candidate) for candidate in ranked]
            assert rollout.choose(request, view, profile, ranked) == growths.index(min(growths))
            weighed += 1
        outcome = place(request, view, profile)
        if isinstance(outcome, Placement):
            view.apply(outcome)
    assert weighed > 10

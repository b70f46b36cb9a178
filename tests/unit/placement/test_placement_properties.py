"""Properties that hold for every policy on any small cluster and any request sequence."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tfcommon.gpu_models import GIB
from tfcommon.placement import (
    POLICIES,
    ClusterView,
    Gpu,
    Isolation,
    Node,
    Placement,
    PlacementRequest,
    PluginArgs,
    place,
    policy,
)

MODELS = {"A100": (312_000, 40 * GIB), "T4": (65_000, 16 * GIB)}


@st.composite
def clusters(draw: st.DrawFn) -> list[Node]:
    nodes = []
    for n in range(draw(st.integers(1, 5))):
        model = draw(st.sampled_from(sorted(MODELS)))
        tflops, vram = MODELS[model]
        gpus = tuple(
            Gpu(
                f"node{n}-gpu{i}",
                i,
                model,
                tflops,
                vram,
                used_vram_bytes=draw(st.sampled_from([0, vram // 2, vram])),
            )
            for i in range(draw(st.integers(0, 4)))
        )
        nodes.append(
            Node(f"node{n}", draw(st.integers(1, 8)) * 4000, draw(st.integers(1, 8)) * 8 * GIB, gpus)
        )
    return nodes


@st.composite
def requests(draw: st.DrawFn, index: int) -> PlacementRequest:
    kind = draw(st.sampled_from(["share", "absolute", "shared", "cpu"]))
    common = {
        "name": f"req-{index}",
        "cpu_milli": draw(st.integers(0, 8000)),
        "memory_bytes": draw(st.integers(0, 16)) * GIB,
        "gpu_models": draw(st.sampled_from([frozenset(), frozenset({"T4"}), frozenset({"A100", "T4"})])),
    }
    if kind == "cpu":
        return PlacementRequest(gpu_count=0, **common)  # type: ignore[arg-type]
    count = draw(st.integers(1, 3))
    if kind == "share":
        return PlacementRequest(gpu_count=count, gpu_share=draw(st.integers(1, 1000)), **common)  # type: ignore[arg-type]
    if kind == "shared":
        return PlacementRequest(gpu_count=count, isolation=Isolation.SHARED, **common)  # type: ignore[arg-type]
    return PlacementRequest(
        gpu_count=count,
        tflops_milli=draw(st.integers(0, 100_000)),
        vram_bytes=draw(st.integers(1, 20)) * GIB,
        **common,  # type: ignore[arg-type]
    )


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[Node], list[PlacementRequest], str]:
    nodes = draw(clusters())
    sequence = [draw(requests(i)) for i in range(draw(st.integers(1, 12)))]
    return nodes, sequence, draw(st.sampled_from(sorted(POLICIES)))


def replay(
    nodes: list[Node], sequence: list[PlacementRequest], name: str
) -> tuple[ClusterView, list[object]]:
    profile = policy(name, PluginArgs.learned_from(sequence, seed=7))
    view = ClusterView(nodes)
    outcomes: list[object] = []
    for request in sequence:
        fresh = place(request, list(view.nodes.values()), profile)
        outcome = place(request, view, profile)
        assert outcome == fresh, "the incremental view decides like a fresh one"
        if isinstance(outcome, Placement):
            check_placement(view.nodes[outcome.node], request, outcome)
            view.apply(outcome)
            check_capacity(view.nodes[outcome.node])
        outcomes.append(outcome)
    return view, outcomes


def check_placement(node: Node, request: PlacementRequest, placement: Placement) -> None:
    assert len(placement.gpu_indices) == len(set(placement.gpu_indices)) == request.gpu_count
    assert placement.gpu_uuids == tuple(node.gpus[i].uuid for i in placement.gpu_indices)
    for index in placement.gpu_indices:
        gpu = node.gpus[index]
        assert not request.gpu_models or gpu.model in request.gpu_models
        if request.isolation is Isolation.SHARED:
            assert gpu.is_idle, "shared isolation only takes idle cards"


def check_capacity(node: Node) -> None:
    assert 0 <= node.used_cpu_milli <= node.cpu_milli
    assert 0 <= node.used_memory_bytes <= node.memory_bytes
    for gpu in node.gpus:
        assert 0 <= gpu.used_tflops_milli <= gpu.tflops_milli
        assert 0 <= gpu.used_vram_bytes <= gpu.vram_bytes


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_no_placement_exceeds_capacity_and_every_rule_holds(
    scenario: tuple[list[Node], list[PlacementRequest], str],
) -> None:
    replay(*scenario)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_the_same_input_and_seed_give_the_same_placements(
    scenario: tuple[list[Node], list[PlacementRequest], str],
) -> None:
    _, first = replay(*scenario)
    _, second = replay(*scenario)
    assert first == second


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_releasing_everything_restores_the_cluster(
    scenario: tuple[list[Node], list[PlacementRequest], str],
) -> None:
    nodes, sequence, name = scenario
    view, outcomes = replay(nodes, sequence, name)
    for outcome in reversed(outcomes):
        if isinstance(outcome, Placement):
            view.release(outcome)
    assert {node.name: node for node in nodes} == dict(view.nodes)

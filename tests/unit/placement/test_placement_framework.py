"""`place()` end to end: filters in order, reasons as data, ties by name, reservations applied exactly."""

from __future__ import annotations

import pytest
from tfcommon.gpu_models import GIB
from tfcommon.placement import (
    ClusterView,
    Isolation,
    Placement,
    PlacementRequest,
    PluginArgs,
    ProfileConfig,
    Rejection,
    UnknownPolicyError,
    build_profile,
    evaluate,
    place,
    policy,
)
from tfcommon.placement.testing import A100_TFLOPS, A100_VRAM, a_node


def test_an_unschedulable_request_explains_itself_by_counting_first_reasons() -> None:
    nodes = [
        *(a_node(f"full-{i}", used_shares=(900,)) for i in range(3)),
        *(a_node(f"t4-{i}", model="T4") for i in range(2)),
        a_node("small-cpu", cpu_milli=1000),
    ]
    request = PlacementRequest(name="job", cpu_milli=2000, vram_bytes=8 * GIB, gpu_models=frozenset({"A100"}))
    outcome = place(request, nodes, policy("bestfit"))
    assert isinstance(outcome, Rejection)
    assert outcome.summary() == "0/6 nodes fit: 3 insufficient VRAM, 2 wrong GPU model, 1 insufficient CPU"


def test_a_request_for_a_partitioned_gpu_is_refused_with_a_clear_reason() -> None:
    outcome = place(
        PlacementRequest(name="p", vram_bytes=GIB, isolation=Isolation.PARTITIONED), [a_node()], policy()
    )
    assert isinstance(outcome, Rejection)
    assert outcome.summary() == "0/1 nodes fit: 1 partitioned isolation not supported yet"


def test_an_empty_cluster_says_so() -> None:
    outcome = place(PlacementRequest(name="x", vram_bytes=GIB), [], policy())
    assert isinstance(outcome, Rejection)
    assert outcome.summary() == "0/0 nodes fit: no nodes in the cluster"


def test_equal_scores_go_to_the_node_whose_name_sorts_first() -> None:
    nodes = [a_node(name) for name in ("node-c", "node-a", "node-b")]
    for name in ("bestfit", "fgd", "tfpool", "CompactFirst", "gpupacking"):
        outcome = place(PlacementRequest(name="x", gpu_share=300), nodes, policy(name))
        assert isinstance(outcome, Placement)
        assert outcome.node == "node-a", name


def test_a_multi_gpu_request_lands_on_one_node_with_enough_gpus() -> None:
    nodes = [a_node("two", gpus=2), a_node("four", gpus=4, used_shares=(1000,))]
    outcome = place(PlacementRequest(name="x", gpu_count=3, vram_bytes=GIB), nodes, policy("bestfit"))
    assert isinstance(outcome, Placement)
    assert outcome.node == "four"
    assert outcome.gpu_indices == (1, 2, 3)
    assert outcome.vram_bytes == (GIB, GIB, GIB)


def test_pinned_gpu_indices_restrict_the_choice() -> None:
    outcome = place(PlacementRequest(name="x", vram_bytes=GIB, gpu_indices=(2,)), [a_node(gpus=4)], policy())
    assert isinstance(outcome, Placement)
    assert outcome.gpu_indices == (2,)


def test_shared_isolation_takes_only_an_idle_card_and_reserves_all_of_it() -> None:
    view = ClusterView([a_node("n", gpus=2, used_shares=(10,))])
    outcome = place(PlacementRequest(name="w", isolation=Isolation.SHARED), view, policy("CompactFirst"))
    assert isinstance(outcome, Placement)
    assert outcome.gpu_indices == (1,)
    assert (outcome.tflops_milli, outcome.vram_bytes) == ((A100_TFLOPS,), (A100_VRAM,))
    view.apply(outcome)
    again = place(PlacementRequest(name="w2", isolation=Isolation.SHARED), view, policy("CompactFirst"))
    assert isinstance(again, Rejection)
    assert again.summary() == "0/1 nodes fit: 1 no idle GPU for shared isolation"


def test_apply_then_release_restores_the_node_exactly() -> None:
    node = a_node("n", gpus=2, used_shares=(300,))
    view = ClusterView([node])
    request = PlacementRequest(name="x", cpu_milli=1500, memory_bytes=GIB, gpu_share=400)
    outcome = place(request, view, policy("fgd"))
    assert isinstance(outcome, Placement)
    reserved = view.apply(outcome)
    assert reserved.used_cpu_milli == 1500
    assert reserved.workers == 1
    assert sum(g.used_vram_bytes for g in reserved.gpus) == sum(g.used_vram_bytes for g in node.gpus) + (
        400 * A100_VRAM // 1000
    )
    assert view.release(outcome) == node


def test_the_view_rescores_a_node_after_it_changes() -> None:
    view = ClusterView([a_node("a"), a_node("b")])
    profile = policy("CompactFirst")
    first = place(PlacementRequest(name="1", gpu_share=600), view, profile)
    assert isinstance(first, Placement)
    assert first.node == "a"
    view.apply(first)
    second = place(PlacementRequest(name="2", gpu_share=600), view, profile)
    assert isinstance(second, Placement)
    assert second.node == "b"
    third = place(PlacementRequest(name="3", gpu_share=300), view, profile)
    assert isinstance(third, Placement)
    assert third.node == "a"  # packs onto the fuller node, now that its state changed


def test_the_random_policy_is_reproducible_from_its_seed() -> None:
    nodes = [a_node(f"n{i:02d}") for i in range(20)]
    request = PlacementRequest(name="job-7", gpu_share=100)

    def chosen(seed: int) -> str:
        outcome = place(request, nodes, policy("random", PluginArgs(seed=seed)))
        assert isinstance(outcome, Placement)
        return outcome.node

    assert chosen(42) == chosen(42)
    assert len({chosen(seed) for seed in range(10)}) > 1


def test_a_profile_is_configuration_and_unknown_names_are_refused() -> None:
    profile = build_profile(ProfileConfig("mixed", (("BestFit", 2), ("GpuPacking", 1))), PluginArgs())
    assert isinstance(place(PlacementRequest(name="x", gpu_share=10), [a_node()], profile), Placement)
    with pytest.raises(UnknownPolicyError, match="unknown score plugin 'Nope'"):
        build_profile(ProfileConfig("bad", (("Nope", 1),)), PluginArgs())
    with pytest.raises(UnknownPolicyError, match="unknown policy 'bogus'"):
        policy("bogus")


def test_evaluate_explains_one_node() -> None:
    profile = policy("bestfit")
    assert (
        evaluate(profile, PlacementRequest(name="x", vram_bytes=GIB, vendor="amd"), a_node())
        == "wrong GPU vendor"
    )
    assert not isinstance(evaluate(profile, PlacementRequest(name="x", vram_bytes=GIB), a_node()), str)


def test_the_view_stays_correct_when_its_memo_is_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    import tfcommon.placement.framework as framework

    monkeypatch.setattr(framework, "MEMO_LIMIT", 3)
    view = ClusterView([a_node(f"n{i}", gpus=2) for i in range(4)])
    profile = policy("bestfit")
    for step in range(12):
        request = PlacementRequest(name=f"r{step}", gpu_share=150 + 10 * step)
        fresh = place(request, list(view.nodes.values()), profile)
        outcome = place(request, view, profile)
        assert outcome == fresh
        if isinstance(outcome, Placement):
            view.apply(outcome)
    assert sum(node.workers for node in view.nodes.values()) == 12

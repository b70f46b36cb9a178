"""Card values: the idle share a card with a given free share is expected to keep for good, calibrated
from the target workload, and the node measure the default policy's rollout weighs them with."""

from __future__ import annotations

import pytest
from tfcommon.placement import (
    ClusterView,
    Placement,
    PlacementRequest,
    PluginArgs,
    TargetWorkload,
    WorkloadClass,
    place,
    policy,
)
from tfcommon.placement.card_value import (
    CardValueMeasure,
    CardValues,
    calibrate_card_values,
    card_values_for,
)
from tfcommon.placement.testing import a_node

GIB = 1024**3


def share_class(share: int, cpu_milli: int = 1000, memory_bytes: int = 0) -> WorkloadClass:
    return WorkloadClass(cpu_milli, 1, share, memory_bytes=memory_bytes)


def test_whole_gpu_pods_fill_every_free_card_and_never_close_a_partial_hole() -> None:
    values = calibrate_card_values(TargetWorkload(((share_class(1000), 1.0),)), cards=512)

    assert values(1000) == 0.0
    assert [values(free) for free in (0, 190, 500, 999)] == [0.0, 190.0, 500.0, 999.0]


def test_half_gpu_pods_close_every_half_card_at_130_percent_demand() -> None:
    values = calibrate_card_values(TargetWorkload(((share_class(500), 1.0),)), cards=512)

    assert values(1000) == 0.0
    assert values(500) == 0.0
    assert values(499) == 499.0
    assert values(120) == 120.0


def test_a_free_card_ends_with_the_810_pods_hole_as_often_as_810_pods_take_free_cards() -> None:
    target = TargetWorkload(((share_class(1000), 0.75), (share_class(810), 0.25)))

    values = calibrate_card_values(target, cards=4096)

    assert values(190) == 190.0
    assert 0.2 * 190 <= values(1000) <= 0.3 * 190


def test_a_hole_the_common_pod_closes_is_worth_less_than_one_only_rare_pods_close() -> None:
    target = TargetWorkload(
        (
            (share_class(1000), 0.5),
            (share_class(650), 0.2),
            (share_class(320), 0.25),
            (share_class(230), 0.05),
        )
    )

    values = calibrate_card_values(target, cards=4096)

    assert values(350) < values(120)
    assert values(120) == pytest.approx(120.0, abs=1.0)


def test_the_same_workload_always_gives_the_same_values_and_the_default_is_kept() -> None:
    target = TargetWorkload(((share_class(1000), 0.6), (share_class(470), 0.3), (share_class(160), 0.1)))

    assert calibrate_card_values(target, cards=1024) == calibrate_card_values(target, cards=1024)
    assert card_values_for(target) is card_values_for(target)


def test_a_workload_without_gpu_pods_gives_best_fits_values() -> None:
    cpu_only = TargetWorkload(((WorkloadClass(4000, 0, 0), 1.0),))

    assert calibrate_card_values(cpu_only) == CardValues.best_fit()


def test_the_measure_sums_the_card_values_of_a_node_that_can_still_host_a_gpu_pod() -> None:
    target = TargetWorkload(((share_class(500, cpu_milli=4000, memory_bytes=8 * GIB), 1.0),))
    measure = CardValueMeasure(CardValues.best_fit(), target)
    node = a_node("a", gpus=2, used_shares=(600, 0), cpu_milli=16_000, memory_bytes=64 * GIB)

    assert measure(node) == 400.0 + 0.0


@pytest.mark.parametrize(
    ("used_cpu_milli", "used_memory_bytes"),
    [(13_000, 0), (0, 61 * GIB)],
    ids=["no CPU left for any GPU pod", "no memory left for any GPU pod"],
)
def test_the_measure_counts_all_free_gpu_of_a_node_no_gpu_pod_fits_as_idle(
    used_cpu_milli: int, used_memory_bytes: int
) -> None:
    target = TargetWorkload(
        (
            (share_class(500, cpu_milli=4000, memory_bytes=8 * GIB), 0.5),
            (share_class(1000, cpu_milli=8000, memory_bytes=4 * GIB), 0.5),
        )
    )
    measure = CardValueMeasure(CardValues.best_fit(), target)
    node = a_node(
        "a",
        gpus=2,
        used_shares=(600, 0),
        cpu_milli=16_000,
        memory_bytes=64 * GIB,
        used_cpu_milli=used_cpu_milli,
        used_memory_bytes=used_memory_bytes,
    )

    assert measure(node) == 400.0 + 1000.0


def test_the_default_policy_keeps_a_hole_for_the_pods_that_close_it_exactly() -> None:
    """A 230 pod could take the 350 hole beside a 650 pod (120 left, which only rare pods close) or a
    free card; 320 pods are common, so the hole is kept for them."""
    requests = [PlacementRequest(name=f"whole-{i}", cpu_milli=1000, gpu_share=1000) for i in range(50)]
    requests += [PlacementRequest(name=f"big-{i}", cpu_milli=1000, gpu_share=650) for i in range(20)]
    requests += [PlacementRequest(name=f"fill-{i}", cpu_milli=1000, gpu_share=320) for i in range(25)]
    requests += [PlacementRequest(name=f"small-{i}", cpu_milli=1000, gpu_share=230) for i in range(5)]
    args = PluginArgs.learned_from(requests)
    view = ClusterView([a_node("a", used_shares=(650,)), a_node("b"), a_node("c")])

    outcome = place(PlacementRequest(name="job", cpu_milli=1000, gpu_share=230), view, policy(args=args))

    assert isinstance(outcome, Placement)
    assert outcome.node != "a"


def test_the_measure_adds_fgds_fragment_of_the_classes_card_values_cannot_see() -> None:
    """An 8-GPU class needs eight free cards on one node: a node with all eight free serves it, a node
    with seven free cards does not, which card values (one card at a time) cannot tell."""
    eight = WorkloadClass(1000, 8, 1000)
    target = TargetWorkload(((share_class(1000), 0.9), (eight, 0.1)))
    measure = CardValueMeasure(CardValues.best_fit(), target)

    all_free = a_node("all", gpus=8, cpu_milli=64_000)
    one_used = a_node("one", gpus=8, used_shares=(1000,), cpu_milli=64_000)

    assert measure(all_free) == 0.0
    assert measure(one_used) == pytest.approx(0.1 * 7000)


def test_the_measure_adds_fgds_fragment_of_the_classes_limited_to_some_models() -> None:
    t4_only = WorkloadClass(1000, 1, 500, frozenset({"T4"}))
    target = TargetWorkload(((share_class(1000), 0.5), (t4_only, 0.5)))
    measure = CardValueMeasure(CardValues.best_fit(), target)
    half_used = {"used_shares": (500,), "cpu_milli": 16_000}

    assert measure(a_node("t4", model="T4", **half_used)) == 500.0  # best fit's value; T4 pods fit
    assert measure(a_node("v100", model="V100", **half_used)) == 500.0 + 0.5 * 500

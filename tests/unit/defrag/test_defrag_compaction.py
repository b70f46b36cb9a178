"""Compaction: empty, old, unprotected nodes get should-delete while the pool keeps its reserves."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from defrag_builders import H100_TFLOPS, H100_VRAM, NOW, a_node
from tfdefrag.core.compaction import Resources, parse_capacity, plan_compaction
from tfdefrag.core.planner import SkipReason


def test_an_empty_old_node_is_marked_for_deletion() -> None:
    decision = plan_compaction([a_node("busy", (500, 0)), a_node("idle", (0, 0))], NOW)

    assert decision.mark == ("idle",)


def test_protected_young_and_unready_nodes_are_kept_with_their_reason() -> None:
    nodes = [
        a_node("busy", (500, 0)),
        a_node("pinned", (0, 0), gpu_node_labels={"tensor-fusion.ai/do-not-disrupt": "true"}),
        replace(a_node("young", (0, 0)), created_at=NOW - timedelta(minutes=4)),
        a_node("down", (0, 0), ready=False),
    ]

    decision = plan_compaction(nodes, NOW)

    assert decision.mark == ()
    assert {(skip.node, skip.reason) for skip in decision.kept} == {
        ("pinned", SkipReason.DO_NOT_DISRUPT),
        ("young", SkipReason.EMPTY),
        ("down", SkipReason.NOT_READY),
    }


def test_removal_keeps_warm_and_minimum_resources() -> None:
    nodes = [a_node("busy", (1000, 1000)), a_node("idle-1", (0, 0)), a_node("idle-2", (0, 0))]
    two_gpus_free = Resources(2 * H100_TFLOPS, 2 * H100_VRAM)

    warm = plan_compaction(nodes, NOW, warm=two_gpus_free)
    minimum = plan_compaction(nodes, NOW, minimum=Resources(6 * H100_TFLOPS, 0))

    assert warm.mark == ("idle-1",)
    assert minimum.mark == ()
    assert "warmResources/minResources" in minimum.kept[0].message


def test_warm_capacity_the_pool_maximum_would_never_let_it_use_is_compacted() -> None:
    nodes = [a_node("busy", (1000, 1000)), a_node("idle-1", (0, 0)), a_node("idle-2", (0, 0))]
    four_gpus_free = Resources(4 * H100_TFLOPS, 4 * H100_VRAM)

    def gpus(count: int) -> tuple[int, int]:
        return count * H100_TFLOPS, count * H100_VRAM

    uncapped = plan_compaction(nodes, NOW, warm=four_gpus_free)
    two_more = plan_compaction(nodes, NOW, warm=four_gpus_free, maximum=gpus(4))
    at_maximum = plan_compaction(nodes, NOW, warm=four_gpus_free, maximum=gpus(2))

    assert uncapped.mark == ()
    assert two_more.mark == ("idle-1",)  # the maximum lets the pool reserve 2 more GPUs: one node kept
    assert at_maximum.mark == ("idle-1", "idle-2")


def test_capacity_settings_are_parsed_with_field_names() -> None:
    minimum, warm, problems = parse_capacity(
        "p", {"minResources": {"tflops": "100", "vram": "80Gi"}, "warmResources": {"vram": "lots"}}
    )

    assert minimum == Resources(100_000, 80 << 30)
    assert warm == Resources(0, 0)
    assert "spec.capacityConfig.warmResources.vram" in problems[0]

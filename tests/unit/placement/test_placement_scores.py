"""Score plugins rank feasible nodes by one rule each; table-driven where a table says it best."""

from __future__ import annotations

import pytest
from tfcommon.placement import Placement, PlacementRequest, PluginArgs, place, policy
from tfcommon.placement.scores import (
    CompactFirst,
    GpuClustering,
    GpuPacking,
    LowLoadFirst,
    NodeCompactGpuLowLoad,
)
from tfcommon.placement.testing import a_node


@pytest.mark.parametrize(
    ("policy_name", "expected_node", "expected_gpu"),
    [
        pytest.param("CompactFirst", "busy", 1, id="compact-packs-node-and-gpu"),
        pytest.param("LowLoadFirst", "idle", 0, id="low-load-spreads"),
        pytest.param("NodeCompactGPULowLoad", "busy", 0, id="default-packs-node-spreads-gpu"),
    ],
)
def test_tensorfusion_modes(policy_name: str, expected_node: str, expected_gpu: int) -> None:
    nodes = [a_node("idle", gpus=2), a_node("busy", gpus=2, used_shares=(0, 500))]
    outcome = place(PlacementRequest(name="x", gpu_share=100), nodes, policy(policy_name))
    assert isinstance(outcome, Placement)
    assert (outcome.node, outcome.gpu_indices) == (expected_node, (expected_gpu,))


def test_tensorfusion_scores_weigh_vram_0_7_and_tflops_0_3() -> None:
    node = a_node(gpus=2, used_shares=(500, 0))
    request = PlacementRequest(name="x", gpu_share=100)
    assert CompactFirst().score(request, node, (0, 1)).score == 25  # (50 + 0) / 2
    assert LowLoadFirst().score(request, node, (0, 1)).score == 75
    assert NodeCompactGpuLowLoad().score(request, node, (0, 1)).gpus == (1,)


@pytest.mark.parametrize(
    ("used_shares", "expected"),
    [
        pytest.param((0, 0), 31, id="idle-node-small-first"),
        pytest.param((1000, 0), 49, id="used-node-breaks-one-idle-gpu"),
        pytest.param((700, 0), 97, id="shares-a-gpu-with-300-left"),
    ],
)
def test_gpu_packing_bands(used_shares: tuple[int, ...], expected: int) -> None:
    node = a_node(gpus=2, used_shares=used_shares)
    request = PlacementRequest(name="x", gpu_share=200)
    candidates = tuple(i for i, gpu in enumerate(node.gpus) if gpu.free_share >= 200)
    assert GpuPacking().score(request, node, candidates).score == expected


@pytest.mark.parametrize(
    ("hosted", "expected"),
    [
        pytest.param((("share", 2),), 75, id="only-same-class"),
        pytest.param((("1-gpu", 1), ("share", 1)), 50, id="mixed-with-same"),
        pytest.param((), 25, id="idle"),
        pytest.param((("1-gpu", 1),), 0, id="other-class"),
    ],
)
def test_gpu_clustering_bands(hosted: tuple[tuple[str, int], ...], expected: int) -> None:
    node = a_node(gpus=8, workload_classes=hosted)
    score = GpuClustering().score(PlacementRequest(name="x", gpu_share=200), node, tuple(range(8))).score
    assert score == expected


def test_bestfit_prefers_the_node_left_fullest() -> None:
    nodes = [a_node("roomy", gpus=8), a_node("tight", gpus=2, used_shares=(600,))]
    outcome = place(PlacementRequest(name="x", gpu_share=300, cpu_milli=1000), nodes, policy("bestfit"))
    assert isinstance(outcome, Placement)
    assert (outcome.node, outcome.gpu_indices) == ("tight", (0,))


def test_dotproduct_prefers_the_smallest_alignment() -> None:
    nodes = [a_node("roomy", gpus=8), a_node("tight", gpus=2, used_shares=(600, 1000))]
    args = PluginArgs(max_cpu_milli=32_000, max_gpu_share=8000)
    outcome = place(
        PlacementRequest(name="x", gpu_share=300, cpu_milli=1000), nodes, policy("dotproduct", args)
    )
    assert isinstance(outcome, Placement)
    assert outcome.node == "tight"

"""The fragmentation measure and the FGD score against small cases worked by hand from the paper.

The node in every case: 8 CPUs free, four T4 GPUs with 1000, 500, 200 and 0 thousandths free
(1700 free in all). Target workload: A = 1 GPU x 300 with 1 CPU (p 0.5), B = 1 whole GPU with 1 CPU
(p 0.25), C = 1 GPU x 100 with 16 CPUs (p 0.125, never fits: CPU), D = CPU only, 1 CPU (p 0.125).
"""

from __future__ import annotations

import math

import pytest
from tfcommon.gpu_models import GIB
from tfcommon.placement import (
    Gpu,
    Node,
    PlacementRequest,
    TargetWorkload,
    WorkloadClass,
    cluster_fragmentation,
)
from tfcommon.placement.fragmentation import class_fragment, node_fragment
from tfcommon.placement.gradient import FragmentationGradient

GPUS = (("T4", 1000), ("T4", 500), ("T4", 200), ("T4", 0))
A = WorkloadClass(cpu_milli=1000, gpu_count=1, gpu_share=300)
B = WorkloadClass(cpu_milli=1000, gpu_count=1, gpu_share=1000)
C = WorkloadClass(cpu_milli=16_000, gpu_count=1, gpu_share=100)
D = WorkloadClass(cpu_milli=1000, gpu_count=0, gpu_share=0)
TARGET = TargetWorkload(((A, 0.5), (B, 0.25), (C, 0.125), (D, 0.125)))


@pytest.mark.parametrize(
    ("workload_class", "expected"),
    [
        pytest.param(A, 200, id="fits: only the GPUs below 300 are fragment (200 + 0)"),
        pytest.param(B, 700, id="fits on the idle GPU: the partial ones are fragment (500 + 200)"),
        pytest.param(C, 1700, id="lacks CPU: all free GPU is fragment"),
        pytest.param(D, 1700, id="CPU-only task: all free GPU is fragment"),
        pytest.param(WorkloadClass(1000, 1, 300, frozenset({"V100M16"})), 1700, id="no access to the model"),
        pytest.param(WorkloadClass(1000, 2, 1000), 1700, id="two whole GPUs do not fit"),
        pytest.param(WorkloadClass(1000, 2, 500), 200, id="two halves fit on 1000 and 500"),
    ],
)
def test_class_fragment(workload_class: WorkloadClass, expected: int) -> None:
    assert class_fragment(8000, GPUS, workload_class) == expected


def test_node_fragment_is_the_popularity_weighted_sum() -> None:
    # 0.5 * 200 + 0.25 * 700 + 0.125 * 1700 + 0.125 * 1700
    assert node_fragment(8000, GPUS, TARGET) == pytest.approx(700.0)


def test_memory_strands_gpus_only_when_asked_to() -> None:
    hungry = WorkloadClass(1000, 1, 300, memory_bytes=64 * GIB)
    assert class_fragment(8000, GPUS, hungry) == 200
    assert class_fragment(8000, GPUS, hungry, free_memory_bytes=32 * GIB) == 1700


def test_cluster_fragmentation_rate_is_fragment_over_idle() -> None:
    capacity = 16 * GIB
    gpus = tuple(
        Gpu(
            f"g{i}",
            i,
            "T4",
            1000,
            capacity,
            used_tflops_milli=1000 - free,
            used_vram_bytes=(1000 - free) * capacity // 1000,
        )
        for i, (_, free) in enumerate(GPUS)
    )
    report = cluster_fragmentation([Node("n", 8000, 64 * GIB, gpus)], TARGET)
    assert report.fragment == pytest.approx(700.0)
    assert (report.idle, report.capacity) == (1700, 4000)
    assert report.rate == pytest.approx(700 / 1700)


def test_fgd_scores_each_gpu_by_the_sigmoid_of_the_fragment_it_saves() -> None:
    capacity = 16 * GIB
    gpus = tuple(
        Gpu(
            f"g{i}",
            i,
            "T4",
            1000,
            capacity,
            used_tflops_milli=1000 - free,
            used_vram_bytes=(1000 - free) * capacity // 1000,
        )
        for i, (_, free) in enumerate(GPUS)
    )
    node = Node("n", 8000, 64 * GIB, gpus)
    request = PlacementRequest(name="x", cpu_milli=1000, gpu_share=300)
    # On GPU 1 (500 -> 200): F = 0.5*400 + 0.25*400 + 0.25*1400 = 650, delta +50 -> 51.
    # On GPU 0 (1000 -> 700): F = 0.5*200 + 0.25*1400 + 0.25*1400 = 800, delta -100 -> 47.
    scored = FragmentationGradient(TARGET).score(request, node, (0, 1))
    assert scored.gpus == (1,)
    assert scored.score == int(100 / (1 + math.exp(-0.05))) == 51


def test_target_workload_keeps_the_popular_classes_covering_95_percent() -> None:
    requests = [PlacementRequest(name=f"a{i}", gpu_share=500) for i in range(60)]
    requests += [PlacementRequest(name=f"b{i}", gpu_share=1000) for i in range(36)]
    requests += [PlacementRequest(name=f"c{i}", gpu_share=100) for i in range(4)]
    target = TargetWorkload.from_requests(requests)
    assert [(c.gpu_share, round(p, 4)) for c, p in target.classes] == [(500, 0.625), (1000, 0.375)]


def test_a_memory_aware_target_keeps_fgds_classes_with_their_median_memory() -> None:
    requests = [PlacementRequest(name=f"a{i}", gpu_share=500, memory_bytes=i * GIB) for i in (1, 2, 9)]
    requests += [PlacementRequest(name=f"b{i}", gpu_share=1000, memory_bytes=4 * GIB) for i in range(2)]
    plain = TargetWorkload.from_requests(requests)
    aware = TargetWorkload.from_requests(requests, with_memory=True)
    assert [(c.gpu_share, p) for c, p in aware.classes] == [(c.gpu_share, p) for c, p in plain.classes]
    assert [c.memory_bytes for c, _ in aware.classes] == [2 * GIB, 4 * GIB]
    assert [c.memory_bytes for c, _ in plain.classes] == [0, 0]

"""Requests validate on construction and convert per-GPU demands the way TensorFusion does."""

from __future__ import annotations

import pytest
from tfcommon.gpu_models import GIB
from tfcommon.placement import Isolation, NodeSelectorRequirement, PlacementRequest, PlacementRequestError
from tfcommon.placement.testing import A100_TFLOPS, A100_VRAM, a_gpu


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        pytest.param(
            {"gpu_count": 129, "vram_bytes": 1}, "gpu_count is 129; use 0 (CPU only) to 128", id="too-many"
        ),
        pytest.param({"gpu_count": -1}, "gpu_count is -1", id="negative-count"),
        pytest.param(
            {"cpu_milli": -5, "vram_bytes": 1}, "cpu_milli is -5; use a value >= 0", id="negative-cpu"
        ),
        pytest.param({"gpu_share": 0}, "gpu_share is 0; use 1..1000", id="share-zero"),
        pytest.param({"gpu_share": 1001}, "gpu_share is 1001", id="share-too-big"),
        pytest.param(
            {"compute_percent": 101, "vram_bytes": 1}, "compute_percent is 101; use 1..100", id="percent"
        ),
        pytest.param({"gpu_share": 500, "vram_bytes": 1}, "give one form only", id="share-and-vram"),
        pytest.param({"gpu_count": 1}, "give per-GPU TFLOPS or VRAM", id="no-demand"),
        pytest.param(
            {"gpu_count": 2, "vram_bytes": 1, "gpu_indices": (3,)}, "pin at least gpu_count", id="pins"
        ),
        pytest.param(
            {
                "vram_bytes": 1,
                "required_node_affinity": ((NodeSelectorRequirement("zone", "Near", ("a",)),),),
            },
            "uses operator 'Near'",
            id="affinity-operator",
        ),
    ],
)
def test_a_malformed_request_names_the_field_and_the_fix(fields: dict[str, object], message: str) -> None:
    with pytest.raises(PlacementRequestError, match="request 'job'") as raised:
        PlacementRequest(name="job", **fields)  # type: ignore[arg-type]
    assert message in str(raised.value)


def test_cpu_only_and_shared_requests_need_no_per_gpu_demand() -> None:
    PlacementRequest(name="cpu", gpu_count=0, cpu_milli=1000)
    PlacementRequest(name="whole", gpu_count=2, isolation=Isolation.SHARED)


def test_compute_percent_is_truncated_to_whole_tflops_like_tensorfusion() -> None:
    request = PlacementRequest(name="p", compute_percent=33, vram_bytes=GIB)
    assert request.tflops_on(a_gpu()) == 102_000  # 33% of 312 TFLOPS = 102.96, truncated
    assert request.vram_on(a_gpu()) == GIB


def test_a_share_applies_to_both_tflops_and_vram() -> None:
    request = PlacementRequest(name="s", gpu_share=250)
    assert request.tflops_on(a_gpu()) == A100_TFLOPS // 4
    assert request.vram_on(a_gpu()) == A100_VRAM // 4
    assert request.share_on(a_gpu()) == 250


def test_shared_isolation_reserves_the_whole_card() -> None:
    request = PlacementRequest(name="w", isolation=Isolation.SHARED)
    assert (request.tflops_on(a_gpu()), request.vram_on(a_gpu())) == (A100_TFLOPS, A100_VRAM)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        pytest.param({"gpu_count": 0, "cpu_milli": 1}, "cpu", id="cpu"),
        pytest.param({"gpu_share": 470}, "share", id="fraction"),
        pytest.param({"gpu_count": 2, "gpu_share": 1000}, "2-gpu", id="whole"),
        pytest.param({"gpu_count": 4, "isolation": Isolation.SHARED}, "4-gpu", id="shared"),
        pytest.param({"gpu_count": 2, "vram_bytes": GIB}, "2-gpu-share", id="multi-fraction"),
    ],
)
def test_workload_class_groups_requests_by_gpu_demand(fields: dict[str, object], expected: str) -> None:
    assert PlacementRequest(name="c", **fields).workload_class == expected  # type: ignore[arg-type]

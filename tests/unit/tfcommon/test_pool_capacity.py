"""`tfcommon.pool_capacity`: a GPUPool's maxResources, oversubscription and nodeSelector, read from its
spec as TensorFusion writes them, and what placement makes of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from tfcommon.gpu_models import GIB
from tfcommon.placement import ClusterView, Placement, PlacementRequest, Rejection, place, policy
from tfcommon.placement.testing import a_node
from tfcommon.pool_capacity import (
    HostFacts,
    Oversubscription,
    PoolCapacity,
    capacity_problems,
    membership_reason,
    over_maximum,
    pool_capacity,
    virtual_capacity,
    with_virtual_capacity,
)

SAMPLE = Path(__file__).resolve().parents[2] / "integration/deploy/tensorfusion_samples/v1_gpupool.yaml"


def sample_spec() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())["spec"]
    return spec


def test_tensorfusions_sample_pool_is_read_as_written() -> None:
    capacity, problems = pool_capacity("sample", sample_spec())

    assert problems == ()
    assert (capacity.max_tflops_milli, capacity.max_vram_bytes) == (100_000, 100 * GIB)
    assert capacity.oversubscription == Oversubscription(2000, 60, 50)
    assert capacity.admits_node("npu-1", {"huawei.com/npu.present": "true"})
    assert not capacity.admits_node("gpu-1", {"nvidia.com/gpu.present": "true"})
    assert capacity.capped


def test_oversubscription_fields_left_out_take_tensorfusions_defaults() -> None:
    capacity, _ = pool_capacity("p", {"capacityConfig": {"oversubscription": {"tflopsOversellRatio": 200}}})
    explicit_zero, _ = pool_capacity(
        "p", {"capacityConfig": {"oversubscription": {"vramExpandToHostMem": 0}}}
    )

    assert capacity.oversubscription == Oversubscription(200, 70, 50)
    assert explicit_zero.oversubscription == Oversubscription(500, 70, 0)
    assert pool_capacity("p", {})[0] == PoolCapacity()


def test_virtual_capacity_is_tensorfusions_formula_in_integers() -> None:
    virtual = virtual_capacity(
        Oversubscription(250, 70, 50),
        tflops_milli=2 * 312_000,
        vram_bytes=80 * GIB,
        host_memory_bytes=100 * GIB,
        host_disk_bytes=10 * GIB,
    )

    assert virtual.tflops_milli == 1_560_000  # 624 TFLOPS x 250 / 100
    assert virtual.vram_bytes == 80 * GIB + 7 * GIB + 50 * GIB


def test_a_node_gets_virtual_capacity_only_in_an_oversubscribed_pool() -> None:
    node = a_node(gpus=2, memory_bytes=64 * GIB)
    host = HostFacts(memory_bytes=0, disk_bytes=100 * GIB)

    bounded = with_virtual_capacity(node, Oversubscription(200, 10, 50), host)

    assert bounded.virtual_tflops_milli == 2 * 2 * 312_000
    assert bounded.virtual_vram_bytes == 80 * GIB + 10 * GIB + 32 * GIB  # the node's own memory
    assert with_virtual_capacity(bounded, None, host) == node


@pytest.mark.parametrize(
    ("term", "name", "labels", "member"),
    [
        ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, "n1", {"gpu": ""}, True),
        ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, "n1", {"gpu": ""}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["spot"]}]}, "n1", {}, True),
        (
            {"matchExpressions": [{"key": "cards", "operator": "Gt", "values": ["4"]}]},
            "n1",
            {"cards": "8"},
            True,
        ),
        (
            {"matchExpressions": [{"key": "cards", "operator": "Lt", "values": ["4"]}]},
            "n1",
            {"cards": "8"},
            False,
        ),
        ({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}, "n1", {}, True),
        ({"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]}, "n1", {}, False),
        (
            {
                "matchExpressions": [{"key": "gpu", "operator": "Exists"}],
                "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}],
            },
            "n1",
            {"gpu": "yes"},
            False,
        ),
        ({}, "n1", {"gpu": "yes"}, False),  # an empty term matches nothing, as in Kubernetes
    ],
)
def test_node_selector_terms_follow_kubernetes(
    term: dict[str, Any], name: str, labels: dict[str, str], member: bool
) -> None:
    spec = {"nodeManagerConfig": {"nodeSelector": {"nodeSelectorTerms": [term]}}}
    capacity, problems = pool_capacity("p", spec)

    assert problems == ()
    assert capacity.admits_node(name, labels) is member


def test_terms_are_alternatives_and_no_terms_matches_no_node() -> None:
    either = {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
        ]
    }
    none: dict[str, Any] = {"nodeSelectorTerms": []}
    capacity = pool_capacity("p", {"nodeManagerConfig": {"nodeSelector": either}})[0]
    empty = pool_capacity("p", {"nodeManagerConfig": {"nodeSelector": none}})[0]

    assert capacity.admits_node("n", {"zone": "b"})
    assert not capacity.admits_node("n", {"zone": "c"})
    assert not empty.admits_node("n", {"zone": "a"})
    assert membership_reason("train", empty, "n", {}) == (
        "not in GPUPool train (node labels miss its spec.nodeManagerConfig.nodeSelector)"
    )
    assert membership_reason("train", capacity, "n", {"zone": "a"}) is None


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ({"capacityConfig": {"maxResources": {"tflops": "lots"}}}, "spec.capacityConfig.maxResources.tflops"),
        ({"capacityConfig": {"maxResources": {"vram": "-1Gi"}}}, "spec.capacityConfig.maxResources.vram"),
        (
            {"capacityConfig": {"oversubscription": {"tflopsOversellRatio": 50}}},
            "spec.capacityConfig.oversubscription.tflopsOversellRatio is 50; use a whole percent from 100",
        ),
        (
            {"capacityConfig": {"minResources": {"tflops": "20"}, "maxResources": {"tflops": "10"}}},
            "spec.capacityConfig.minResources.tflops is above spec.capacityConfig.maxResources.tflops",
        ),
        (
            {
                "nodeManagerConfig": {
                    "nodeSelector": {
                        "nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "Equals"}]}]
                    }
                }
            },
            "nodeSelectorTerms[0].matchExpressions[0].operator is 'Equals'; use one of DoesNotExist",
        ),
        (
            {
                "nodeManagerConfig": {
                    "nodeSelector": {
                        "nodeSelectorTerms": [
                            {"matchFields": [{"key": "spec.x", "operator": "In", "values": ["1"]}]}
                        ]
                    }
                }
            },
            "matchFields supports only metadata.name",
        ),
    ],
)
def test_an_unreadable_value_is_a_problem_naming_the_field(spec: dict[str, Any], named: str) -> None:
    problems = capacity_problems("p", spec)

    assert len(problems) == 1
    assert named in problems[0]


def test_an_invalid_selector_is_not_used() -> None:
    bad = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "In"}]}]}
    capacity, problems = pool_capacity("p", {"nodeManagerConfig": {"nodeSelector": bad}})

    assert capacity.selector is None
    assert "operator In needs at least one value" in problems[0]


def test_the_maximum_names_the_field_and_the_numbers() -> None:
    capacity = PoolCapacity(max_tflops_milli=100_000, max_vram_bytes=100 * GIB)

    assert over_maximum("train", capacity, (90_000, 10 * GIB), (10_000, GIB)) is None
    refused = over_maximum("train", capacity, (90_000, 10 * GIB), (10_500, GIB))
    assert refused == (
        "GPUPool train: spec.capacityConfig.maxResources.tflops would be 100500m of 100 (in use 90); "
        "waiting for the pool's usage to fall, or raise the maximum"
    )
    vram = over_maximum("train", capacity, (0, 99 * GIB), (0, 2 * GIB))
    assert vram is not None
    assert "maxResources.vram would be 101Gi of 100Gi (in use 99Gi)" in vram


def test_placement_keeps_the_limits_on_a_node_within_its_virtual_capacity() -> None:
    node = with_virtual_capacity(
        a_node("n", gpus=1, memory_bytes=0), Oversubscription(200, 0, 0), HostFacts()
    )  # one A100: 312 TFLOPS physical, 624 virtual; 40Gi VRAM, no host memory counted
    view = ClusterView([node])
    profile = policy("CompactFirst")

    def asking(name: str, limit_tflops: int, limit_vram: int = 0) -> Placement | Rejection:
        request = PlacementRequest(
            name=name,
            tflops_milli=50_000,
            vram_bytes=GIB,
            limit_tflops_milli=limit_tflops,
            limit_vram_bytes=limit_vram,
        )
        return place(request, view, profile)

    first = asking("a", 400_000)
    assert isinstance(first, Placement)
    assert first.limit_tflops_milli == (400_000,)
    view.apply(first)
    second = asking("b", 224_000)  # 400 + 224 = 624: exactly the virtual capacity
    assert isinstance(second, Placement)
    view.apply(second)
    third = asking("c", 0)  # its limit is its request, 50 TFLOPS: over
    assert isinstance(third, Rejection)
    assert third.summary() == "0/1 nodes fit: 1 limits over the pool's oversubscription"
    view.release(first)
    assert isinstance(asking("c", 0), Placement)
    over_vram = asking("d", 0, limit_vram=41 * GIB)
    assert isinstance(over_vram, Rejection)


def test_limits_are_not_checked_on_a_node_without_virtual_capacity() -> None:
    view = ClusterView([a_node("n", gpus=1)])
    request = PlacementRequest(name="a", tflops_milli=10_000, vram_bytes=GIB, limit_tflops_milli=10**9)

    assert isinstance(place(request, view, policy("CompactFirst")), Placement)

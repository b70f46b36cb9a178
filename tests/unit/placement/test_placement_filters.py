"""Each filter plugin checks one property; table-driven like kube-scheduler's plugin tests."""

from __future__ import annotations

import pytest
from tfcommon.gpu_models import GIB
from tfcommon.placement import Isolation, NodeSelectorRequirement, PlacementRequest, Taint, Toleration
from tfcommon.placement.filters import (
    FitsCpu,
    FitsMemory,
    FitsTflops,
    FitsVram,
    IsolationSupported,
    MatchesGpuModel,
    MatchesGpuVendor,
    MatchesNodeAffinity,
    MatchesNodeSelector,
    MatchesPool,
    MaxWorkersPerNode,
    NodeSchedulable,
    SharedTakesIdleGpu,
    ToleratesTaints,
)
from tfcommon.placement.framework import GpuFilter, NodeFilter
from tfcommon.placement.model import Gpu, Node
from tfcommon.placement.testing import a_gpu, a_node


def request(**fields: object) -> PlacementRequest:
    fields.setdefault("vram_bytes", GIB)
    return PlacementRequest(name="r", **fields)  # type: ignore[arg-type]


def zone_in(*zones: str) -> tuple[tuple[NodeSelectorRequirement, ...], ...]:
    return ((NodeSelectorRequirement("zone", "In", zones),),)


NODE_CASES: list[tuple[NodeFilter, PlacementRequest, Node, bool]] = [
    (IsolationSupported(), request(isolation=Isolation.PARTITIONED), a_node(), False),
    (IsolationSupported(), request(isolation=Isolation.HARD), a_node(), True),
    (NodeSchedulable(), request(), a_node(cordoned=True), False),
    (NodeSchedulable(), request(), a_node(), True),
    (MatchesPool(), request(pool="training"), a_node(pool="inference"), False),
    (MatchesPool(), request(pool="training"), a_node(pool="training"), True),
    (MatchesPool(), request(), a_node(pool="anything"), True),
    (MatchesNodeSelector(), request(node_selector={"zone": "a"}), a_node(labels={"zone": "b"}), False),
    (
        MatchesNodeSelector(),
        request(node_selector={"zone": "a"}),
        a_node(labels={"zone": "a", "x": "y"}),
        True,
    ),
    (
        MatchesNodeAffinity(),
        request(required_node_affinity=zone_in("a", "b")),
        a_node(labels={"zone": "c"}),
        False,
    ),
    (
        MatchesNodeAffinity(),
        request(required_node_affinity=zone_in("a", "b")),
        a_node(labels={"zone": "b"}),
        True,
    ),
    (
        MatchesNodeAffinity(),
        request(required_node_affinity=((NodeSelectorRequirement("gpus", "Gt", ("4",)),),)),
        a_node(labels={"gpus": "8"}),
        True,
    ),
    (ToleratesTaints(), request(), a_node(taints=(Taint("gpu", "a100"),)), False),
    (ToleratesTaints(), request(), a_node(taints=(Taint("gpu", "a100", "PreferNoSchedule"),)), True),
    (
        ToleratesTaints(),
        request(tolerations=(Toleration("gpu", "Equal", "a100"),)),
        a_node(taints=(Taint("gpu", "a100"),)),
        True,
    ),
    (
        ToleratesTaints(),
        request(tolerations=(Toleration("gpu", "Exists"),)),
        a_node(taints=(Taint("gpu", "h100", "NoExecute"),)),
        True,
    ),
    (FitsCpu(), request(cpu_milli=4000), a_node(cpu_milli=4000, used_cpu_milli=1), False),
    (FitsCpu(), request(cpu_milli=4000), a_node(cpu_milli=4000), True),
    (FitsMemory(), request(memory_bytes=2 * GIB), a_node(memory_bytes=2 * GIB, used_memory_bytes=1), False),
    (FitsMemory(), request(memory_bytes=2 * GIB), a_node(memory_bytes=2 * GIB), True),
    (MaxWorkersPerNode(2), request(), a_node(workers=2), False),
    (MaxWorkersPerNode(2), request(), a_node(workers=1), True),
]


@pytest.mark.parametrize(
    ("plugin", "the_request", "node", "admitted"),
    [pytest.param(*case, id=f"{case[0].name}-{index}") for index, case in enumerate(NODE_CASES)],
)
def test_node_filter(plugin: NodeFilter, the_request: PlacementRequest, node: Node, admitted: bool) -> None:
    assert plugin.admits(the_request, node) is admitted


GPU_CASES: list[tuple[GpuFilter, PlacementRequest, Gpu, bool]] = [
    (MatchesGpuModel(), request(gpu_models=frozenset({"V100M16", "V100M32"})), a_gpu(model="A100"), False),
    (MatchesGpuModel(), request(gpu_models=frozenset({"V100M16", "V100M32"})), a_gpu(model="V100M32"), True),
    (MatchesGpuModel(), request(), a_gpu(model="T4"), True),
    (MatchesGpuVendor(), request(vendor="amd"), a_gpu(), False),
    (MatchesGpuVendor(), request(vendor="nvidia"), a_gpu(), True),
    (SharedTakesIdleGpu(), request(isolation=Isolation.SHARED, vram_bytes=0), a_gpu(used_share=1), False),
    (SharedTakesIdleGpu(), request(isolation=Isolation.SHARED, vram_bytes=0), a_gpu(), True),
    (SharedTakesIdleGpu(), request(), a_gpu(used_share=900), True),
    (FitsTflops(), request(vram_bytes=0, tflops_milli=200_000), a_gpu(used_share=500), False),
    (FitsTflops(), request(vram_bytes=0, tflops_milli=156_000), a_gpu(used_share=500), True),
    (FitsTflops(), request(compute_percent=51), a_gpu(used_share=500), False),
    (FitsVram(), request(vram_bytes=21 * GIB), a_gpu(used_share=500), False),
    (FitsVram(), request(vram_bytes=20 * GIB), a_gpu(used_share=500), True),
    (FitsVram(), request(vram_bytes=0, gpu_share=501), a_gpu(used_share=500), False),
]


@pytest.mark.parametrize(
    ("plugin", "the_request", "gpu", "admitted"),
    [pytest.param(*case, id=f"{case[0].name}-{index}") for index, case in enumerate(GPU_CASES)],
)
def test_gpu_filter(plugin: GpuFilter, the_request: PlacementRequest, gpu: Gpu, admitted: bool) -> None:
    assert plugin.admits(the_request, a_node(), gpu) is admitted


@pytest.mark.parametrize(
    "plugin", [MatchesGpuModel(), MatchesGpuVendor(), SharedTakesIdleGpu(), FitsTflops(), FitsVram()]
)
def test_a_gpu_filter_skipped_for_a_request_admits_every_gpu_for_it(plugin: GpuFilter) -> None:
    """`applies` lets the framework skip a filter per request: only where it would admit any GPU."""
    requests = [case[1] for case in GPU_CASES] + [request(vram_bytes=0, gpu_share=1000)]
    gpus = [
        a_gpu(model=model, vendor=vendor, used_share=used)
        for model in ("A100", "T4")
        for vendor in ("nvidia", "amd")
        for used in (0, 1, 500, 1000)
    ]
    skipped = [the_request for the_request in requests if not plugin.applies(the_request)]

    assert all(plugin.admits(the_request, a_node(), gpu) for the_request in skipped for gpu in gpus)
    assert any(plugin.applies(the_request) for the_request in requests)

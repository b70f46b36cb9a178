"""Refusals at submission (`tfscheduler.core.refusals`): an unknown pool, a request no node of the pool
could ever hold (named with the largest that fits), and the `enabled-replicas` cap."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from tfcommon.events import GpuRequest, IsolationMode
from tfcommon.placement import Gpu, Node
from tfscheduler.core.refusals import (
    ledger_cards,
    never_fits,
    takeover_full,
    unknown_pool,
)
from tfscheduler.core.view import placement_request

GIB = 1024**3


def a_node(name: str, gpus: int, *, pool: str = "default", vram_gib: int = 80, model: str = "H100") -> Node:
    return Node(
        name=name,
        cpu_milli=64_000,
        memory_bytes=512 * GIB,
        pool=pool,
        gpus=tuple(
            Gpu(uuid=f"{name}-{i}", index=i, model=model, tflops_milli=989_400, vram_bytes=vram_gib * GIB)
            for i in range(gpus)
        ),
    )


POOL = [
    a_node("big", 8),
    a_node("small", 2, vram_gib=24, model="L4"),
    a_node("elsewhere", 16, pool="other", vram_gib=141),
]


def reason(
    *,
    vram_gib: int = 16,
    tflops: int = 20,
    gpu_count: int = 1,
    model: str | None = None,
    isolation: IsolationMode = "soft",
    percent: int | None = None,
    nodes: list[Node] = POOL,
) -> str | None:
    request = GpuRequest(
        pool="default",
        gpu_count=gpu_count,
        tflops_request_milli=tflops * 1000,
        tflops_limit_milli=tflops * 1000,
        vram_request_bytes=vram_gib * GIB,
        vram_limit_bytes=vram_gib * GIB,
        compute_percent_request=percent,
        gpu_model=model,
        isolation=isolation,
    )
    cards = {node.name: node.gpus for node in nodes if node.pool == "default"}
    return never_fits(placement_request("ns/pod", request), cards)


@pytest.mark.parametrize(
    ("request_args", "expected"),
    [
        pytest.param(
            {"vram_gib": 200},
            "vram-request 200Gi exceeds every GPU of pool default (largest: 80Gi)",
            id="vram above every card (the other pool's bigger cards do not count)",
        ),
        pytest.param(
            {"tflops": 2000},
            "tflops-request 2000 exceeds every GPU of pool default (largest: 989.4 TFLOPS)",
            id="tflops above every card",
        ),
        pytest.param(
            {"gpu_count": 12},
            "gpu-count 12 exceeds every node of pool default (largest: 8 GPUs on one node)",
            id="more GPUs than any node",
        ),
        pytest.param(
            {"gpu_count": 3, "model": "L4"},
            "gpu-count 3 exceeds every node of pool default (largest: 2 L4 GPUs on one node)",
            id="more GPUs of the model than any node",
        ),
        pytest.param(
            {"vram_gib": 40, "model": "L4"},
            "vram-request 40Gi exceeds every L4 GPU of pool default (largest: 24Gi)",
            id="vram above every card of the model",
        ),
        pytest.param(
            {"model": "A100"},
            "gpu-model A100: pool default has no such GPU (its models: H100, L4)",
            id="a model the pool lacks",
        ),
    ],
)
def test_a_request_no_node_could_hold_is_refused_with_the_largest_that_fits(
    request_args: dict[str, object], expected: str
) -> None:
    assert reason(**request_args) == expected  # type: ignore[arg-type]


def test_more_gpus_of_the_size_asked_than_any_node_has_names_how_many_hold_it() -> None:
    nodes = [a_node("a", 4, vram_gib=80), a_node("b", 8, vram_gib=24)]
    assert reason(vram_gib=40, gpu_count=6, nodes=nodes) == (
        "gpu-count 6 exceeds every node of pool default (largest: 4 GPUs that hold the request on one node)"
    )


@pytest.mark.parametrize(
    "request_args",
    [
        pytest.param({"vram_gib": 80, "gpu_count": 8}, id="the whole biggest node"),
        pytest.param({"vram_gib": 24, "gpu_count": 2, "model": "L4"}, id="the whole node of the model"),
        pytest.param({"vram_gib": 500, "gpu_count": 8, "isolation": "shared"}, id="shared takes whole cards"),
        pytest.param({"tflops": 0, "percent": 100, "vram_gib": 80}, id="a percent of the card"),
    ],
)
def test_a_request_some_empty_node_holds_is_not_refused(request_args: dict[str, object]) -> None:
    assert reason(**request_args) is None  # type: ignore[arg-type]


def test_a_pool_without_gpus_yet_refuses_nothing() -> None:
    assert reason(vram_gib=10_000, nodes=[]) is None
    assert reason(vram_gib=10_000, nodes=[a_node("registering", 0)]) is None


@dataclass(frozen=True)
class GpuRow:
    uuid: str
    node: str
    index: int
    capacity_vram_bytes: int
    model: str = "H100"
    vendor: str = "NVIDIA"
    capacity_tflops_milli: int = 989_400
    used_tflops_milli: int = 0
    used_vram_bytes: int = 0
    phase: str = "Running"
    numa_node: int | None = None


def test_the_ledger_counts_every_gpu_of_the_pools_nodes_by_capacity() -> None:
    gpus = [
        GpuRow("g0", "n1", 0, 80 * GIB, used_vram_bytes=80 * GIB, phase="Pending"),
        GpuRow("g1", "n1", 3, 80 * GIB),  # an index gap: the view would leave the node's GPUs out
        GpuRow("g2", "n2", 0, 141 * GIB),
    ]
    cards = ledger_cards({"n1": "default", "n2": "other", "n3": "default"}, gpus, "default")
    assert {node: [gpu.uuid for gpu in node_gpus] for node, node_gpus in cards.items()} == {
        "n1": ["g0", "g1"],
        "n3": [],
    }
    wanted = placement_request(
        "ns/pod",
        GpuRequest(
            pool="default",
            gpu_count=2,
            tflops_request_milli=1000,
            tflops_limit_milli=1000,
            vram_request_bytes=80 * GIB,
            vram_limit_bytes=80 * GIB,
        ),
    )
    assert never_fits(wanted, cards) is None


def test_an_unknown_pool_is_refused_naming_the_known_ones() -> None:
    assert unknown_pool("default", {"default", "training"}) is None
    assert unknown_pool("nosuch", {"training", "default"}) == (
        "request.pool: unknown pool 'nosuch'; known pools: default, training"
    )
    assert unknown_pool("nosuch", set()) == "request.pool: unknown pool 'nosuch'; known pools: none"


def test_the_takeover_cap_admits_below_the_limit_only() -> None:
    assert takeover_full("ns/ReplicaSet/web/abc", 2, 1) is None
    refusal = takeover_full("ns/ReplicaSet/web/abc", 1, 1)
    assert refusal is not None
    assert refusal.startswith(
        "enabled-replicas 1: 1 pod(s) of workload ns/ReplicaSet/web/abc already taken over"
    )
    assert takeover_full("ns/ReplicaSet/web/abc", 0, 0) is not None

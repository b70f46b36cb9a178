"""The scheduler core's view helpers: a replacement placed into the defrag hold kept for it
(`into_hold`), the view in which a replacement avoids the GPUs of the workload it replaces
(`with_gpus_full`), and until when a node's block reason holds (`reason_holds_until`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tfcommon.events import GpuRequest
from tfcommon.placement import Gpu, Node, Placement
from tfscheduler.core.view import into_hold, placement_request, reason_holds_until, with_gpus_full

GIB = 1024**3
NOW = datetime(2026, 12, 6, 3, 0, tzinfo=UTC)
NEVER = datetime.max.replace(tzinfo=UTC)


def a_node() -> Node:
    return Node(
        name="node-a",
        cpu_milli=64_000,
        memory_bytes=512 * GIB,
        gpus=(
            Gpu("gpu-0", 0, "H100", 100_000, 80 * GIB, used_tflops_milli=30_000, used_vram_bytes=20 * GIB),
            Gpu("gpu-1", 1, "H100", 200_000, 80 * GIB, used_tflops_milli=50_000, used_vram_bytes=30 * GIB),
            Gpu("gpu-2", 2, "H100", 100_000, 80 * GIB),
        ),
    )


def held_on(*uuids: str) -> Placement:
    indices = {"gpu-0": 0, "gpu-1": 1, "gpu-2": 2}
    return Placement(
        request_name="team-a/trainer-0",
        node="node-a",
        gpu_indices=tuple(indices[uuid] for uuid in uuids),
        gpu_uuids=uuids,
        tflops_milli=tuple(30_000 for _ in uuids),
        vram_bytes=tuple(20 * GIB for _ in uuids),
        cpu_milli=0,
        memory_bytes=0,
        workload_class="share",
        score=0,
        policy="ledger",
    )


def wanting(count: int = 1, *, percent: int | None = None, tflops: int = 20_000) -> GpuRequest:
    return GpuRequest(
        pool="default",
        gpu_count=count,
        tflops_request_milli=tflops,
        tflops_limit_milli=tflops * 2,
        vram_request_bytes=10 * GIB,
        vram_limit_bytes=12 * GIB,
        compute_percent_request=percent,
    )


def test_a_replacement_goes_on_the_held_gpus_sized_on_each_of_them() -> None:
    wanted = placement_request("team-a/trainer-1", wanting(2, percent=10))

    outcome = into_hold(held_on("gpu-1", "gpu-0"), wanted, a_node())

    assert outcome is not None
    assert (outcome.request_name, outcome.node, outcome.policy) == (
        "team-a/trainer-1",
        "node-a",
        "defrag-hold",
    )
    assert (outcome.gpu_uuids, outcome.gpu_indices) == (("gpu-1", "gpu-0"), (1, 0))
    assert outcome.tflops_milli == (20_000, 10_000), "10% of each held GPU"
    assert outcome.vram_bytes == (10 * GIB, 10 * GIB)
    assert len(outcome.limit_tflops_milli) == len(outcome.limit_vram_bytes) == 2


def test_a_replacement_of_another_gpu_count_or_onto_a_gpu_gone_does_not_go_into_the_hold() -> None:
    node = a_node()
    assert into_hold(held_on("gpu-0"), placement_request("team-a/x", wanting(2)), node) is None
    assert into_hold(held_on("gpu-0", "gpu-1"), placement_request("team-a/x", wanting(1)), node) is None
    gone = Node(name="node-a", cpu_milli=64_000, memory_bytes=512 * GIB, gpus=node.gpus[:1])
    assert into_hold(held_on("gpu-1"), placement_request("team-a/x", wanting(1)), gone) is None


def test_the_replaced_gpus_look_full_and_the_others_stay_as_they_are() -> None:
    node = a_node()

    full = with_gpus_full(node, frozenset({"gpu-1", "gpu-2"}))

    assert full.gpus[0] == node.gpus[0]
    assert [(gpu.free_tflops_milli, gpu.free_vram_bytes) for gpu in full.gpus[1:]] == [(0, 0), (0, 0)]
    assert (full.name, full.labels, full.cordoned) == (node.name, node.labels, node.cordoned)


def test_a_block_reason_holds_until_the_heartbeat_goes_stale_and_for_ever_without_one() -> None:
    seen = NOW - timedelta(seconds=4)
    assert reason_holds_until("node-a", seen, 5_000, None, NOW) == seen + timedelta(seconds=15)
    assert reason_holds_until("node-a", seen, 5_000, timedelta(seconds=30), NOW) == seen + timedelta(
        seconds=30
    )
    assert reason_holds_until("node-a", seen, 1_000, None, NOW) == NEVER, "stale already"
    assert reason_holds_until("node-a", None, 5_000, None, NOW) == NEVER

"""The placement view of ledger records that the scheduler and the defrag planner both build: GPU phase,
index checks, taints, workers and block reasons."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from uuid import UUID, uuid4

from tfcommon.events import WorkloadRef
from tfcommon.ledger.records import AllocationRecord, GpuRecord, NodeRecord, ShareRecord
from tfcommon.placement import Taint
from tfcommon.placement.from_ledger import INCOMPLETE_INVENTORY, placement_view

NOW = datetime(2026, 6, 1, 3, 30, tzinfo=UTC)
GIB = 1 << 30


def a_node(name: str, **changes: object) -> NodeRecord:
    values: dict[str, object] = {
        "name": name,
        "pool": "default",
        "labels": {"zone": "a"},
        "taints": (),
        "annotations": {},
        "cpu_allocatable_milli": 64_000,
        "memory_allocatable_bytes": 256 * GIB,
        "cordoned": False,
        "ready": True,
        "last_heartbeat_at": NOW,
    }
    return NodeRecord(**{**values, **changes})  # type: ignore[arg-type]


def a_gpu(node: str, index: int, phase: str = "Running", used: int = 0) -> GpuRecord:
    return GpuRecord(
        uuid=f"gpu-{node}-{index}",
        node=node,
        index=index,
        model="H100",
        vendor="NVIDIA",
        capacity_tflops_milli=989_000,
        capacity_vram_bytes=80 * GIB,
        used_tflops_milli=used,
        used_vram_bytes=used * 80 * GIB // 989_000,
        phase=phase,  # type: ignore[arg-type]
        numa_node=None,
        version=1,
    )


@dataclass(frozen=True)
class Held:
    node: str
    gpus: tuple[str, ...]
    allocation_id: UUID = field(default_factory=uuid4)

    def record(self) -> AllocationRecord:
        return AllocationRecord(
            allocation_id=self.allocation_id,
            workload=WorkloadRef(namespace="ml", name=str(self.allocation_id)),
            pool="default",
            node=self.node,
            qos="medium",
            isolation="soft",
            state="committed",
            shares=tuple(ShareRecord(uuid, 100_000, 8 * GIB, 100_000, 8 * GIB) for uuid in self.gpus),
            created_at=NOW,
            committed_at=NOW,
            released_at=None,
            release_reason=None,
        )


def test_gpus_not_running_are_full_and_workers_are_counted_per_gpu_and_node() -> None:
    gpus = [a_gpu("n", 0, used=100_000), a_gpu("n", 1, phase="Updating"), a_gpu("n", 2, used=200_000)]
    allocations = [Held("n", ("gpu-n-0", "gpu-n-2")).record(), Held("n", ("gpu-n-2",)).record()]

    node = placement_view([a_node("n")], gpus, allocations).nodes["n"]

    assert [(g.index, g.vendor, g.free_tflops_milli, g.workers) for g in node.gpus] == [
        (0, "nvidia", 889_000, 1),
        (1, "nvidia", 0, 0),
        (2, "nvidia", 789_000, 2),
    ]
    assert node.gpus[1].free_vram_bytes == 0
    assert (node.workers, node.cordoned, node.labels) == (2, False, {"zone": "a"})


def test_a_gap_in_gpu_indices_leaves_the_node_without_gpus_and_blocked() -> None:
    view = placement_view([a_node("gap")], [a_gpu("gap", 0), a_gpu("gap", 2)], [])
    assert view.nodes["gap"].gpus == ()
    assert view.nodes["gap"].cordoned
    assert view.blocked == {"gap": INCOMPLETE_INVENTORY}


def test_taints_default_to_no_schedule_and_block_reasons_cordon_the_node() -> None:
    nodes = [
        a_node("tainted", taints=({"key": "gpu", "value": "a100"}, {"key": "x", "effect": "NoExecute"})),
        a_node("off", cordoned=True),
    ]
    view = placement_view(
        nodes,
        [a_gpu("tainted", 0), a_gpu("off", 0)],
        [],
        block_reason=lambda node: "node cordoned" if node.cordoned else None,
    )
    assert view.nodes["tainted"].taints == (Taint("gpu", "a100", "NoSchedule"), Taint("x", "", "NoExecute"))
    assert view.blocked == {"off": "node cordoned"}
    assert view.nodes["off"].cordoned
    assert len(view.nodes["off"].gpus) == 1

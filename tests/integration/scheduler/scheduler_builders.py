"""Builders for scheduler tests: registered nodes with GPUs, submissions, ledger-history checks."""

from __future__ import annotations

from collections import defaultdict
from uuid import uuid4

from tfcommon.events import GpuRequest, QosLevel, WorkloadRef
from tfcommon.ledger.records import GpuSpec, NodeSpec
from tfcommon.ledger.sql import SqlLedger
from tfscheduler.submission import Submission

GIB = 1024**3


async def register_nodes(
    ledger: SqlLedger, nodes: int, gpus: int, *, tflops_milli: int = 100_000, vram_bytes: int = 80 * GIB
) -> list[str]:
    names = [f"node-{n}-{uuid4().hex[:6]}" for n in range(nodes)]
    for name in names:
        await register_named_node(ledger, name, gpus, tflops_milli=tflops_milli, vram_bytes=vram_bytes)
    return names


async def register_named_node(
    ledger: SqlLedger, name: str, gpus: int = 1, *, tflops_milli: int = 100_000, vram_bytes: int = 80 * GIB
) -> None:
    await ledger.upsert_node(NodeSpec(name=name, pool="default"))
    await ledger.record_heartbeat(name)
    for index in range(gpus):
        await ledger.upsert_gpu(
            GpuSpec(
                uuid=f"gpu-{uuid4()}",
                node=name,
                index=index,
                model="H100",
                vendor="NVIDIA",
                capacity_tflops_milli=tflops_milli,
                capacity_vram_bytes=vram_bytes,
            )
        )


def a_submission(
    *,
    namespace: str = "team-a",
    tflops_milli: int = 10_000,
    vram_bytes: int = 8 * GIB,
    gpu_count: int = 1,
    qos: QosLevel = "medium",
    priority: int = 0,
    eviction_protection_s: int = 0,
    name: str | None = None,
) -> Submission:
    return Submission(
        workload=WorkloadRef(namespace=namespace, name=name or f"pod-{uuid4().hex[:8]}", uid=str(uuid4())),
        request=GpuRequest(
            pool="default",
            gpu_count=gpu_count,
            tflops_request_milli=tflops_milli,
            tflops_limit_milli=tflops_milli,
            vram_request_bytes=vram_bytes,
            vram_limit_bytes=vram_bytes,
            qos=qos,
        ),
        priority=priority,
        eviction_protection_s=eviction_protection_s,
    )


async def assert_history_never_over_capacity(ledger: SqlLedger) -> None:
    """Replay the append-only history: no GPU ever holds more than its capacity."""
    capacity = {
        gpu.uuid: (gpu.capacity_tflops_milli, gpu.capacity_vram_bytes) for gpu in await ledger.list_gpus()
    }
    used: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for entry in await ledger.history():
        sign = {"opened": 1, "committed": 0, "released": -1, "evicted": -1}[entry.kind]
        used[entry.gpu_uuid][0] += sign * entry.tflops_milli
        used[entry.gpu_uuid][1] += sign * entry.vram_bytes
        tflops, vram = used[entry.gpu_uuid]
        assert 0 <= tflops <= capacity[entry.gpu_uuid][0], (
            f"GPU {entry.gpu_uuid} TFLOPS {tflops} after {entry}"
        )
        assert 0 <= vram <= capacity[entry.gpu_uuid][1], f"GPU {entry.gpu_uuid} VRAM {vram} after {entry}"
